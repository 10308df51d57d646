"""A redis-py client whose sockets are gevent's, whether or not the process is
monkey-patched (``ProtoServer.start()`` serves from a thread with its own gevent hub in a
plain program, where a stdlib socket would block every connection of that hub)."""

from __future__ import annotations

import socket as stdlib_socket

import redis
from gevent import socket as gsocket


class GeventConnection(redis.connection.Connection):
    def _connect(self) -> gsocket.socket:
        sock = gsocket.create_connection((self.host, self.port),
                                         timeout=self.socket_connect_timeout)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
        if self.socket_keepalive:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
        sock.settimeout(self.socket_timeout)
        return sock


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client for ``url`` (redis://host:port/db); nothing is connected until first use."""
    pool = redis.ConnectionPool.from_url(
        url, connection_class=GeventConnection, socket_connect_timeout=timeout,
        socket_timeout=timeout, health_check_interval=0, max_connections=None)
    return redis.Redis(connection_pool=pool)


def text(reply: bytes | str) -> str:
    """A Redis reply as text (this client's replies are bytes: no decode_responses)."""
    return reply.decode() if isinstance(reply, bytes) else reply


#: What a lost or refused Redis connection raises (the cluster then runs degraded).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, OSError)
