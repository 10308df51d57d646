"""A redis-py client whose sockets are gevent's, whether or not the process is
monkey-patched (``ProtoServer.start()`` serves from a thread with its own gevent hub in a
plain program, where a stdlib socket would block every connection of that hub).

``pack`` and ``GeventConnection.execute_packed`` are the journal's short way through one
command: the command packed by one join, written with ``send`` and its reply read by
redis-py's parser, without redis-py's per-command machinery (the retry wrapper, the
observability hooks, gevent's ``sendall`` asking the socket's buffer size every call).
Errors are redis-py's: a lost connection raises its ConnectionError (the caller goes the
long way, which reconnects and retries), an error reply its ResponseError subclass.
"""

from __future__ import annotations

import socket as stdlib_socket
from typing import Any

import redis
from gevent import socket as gsocket
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class GeventConnection(redis.connection.Connection):
    def _connect(self) -> gsocket.socket:
        sock = gsocket.create_connection((self.host, self.port),
                                         timeout=self.socket_connect_timeout)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
        if self.socket_keepalive:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
        sock.settimeout(self.socket_timeout)
        return sock

    def execute_packed(self, command: bytes) -> Any:
        """Send one command ``pack`` made and return its reply (an error reply raised).
        A socket failure drops the connection and raises as ``send_packed_command`` does
        (the next call connects again)."""
        if not self._sock:
            self.connect()
        sock: Any = self._sock
        try:
            sent = sock.send(command)  # (gevent waits for room, up to the socket timeout)
            if sent < len(command):
                view = memoryview(command)
                while sent < len(command):
                    sent += sock.send(view[sent:])
        except stdlib_socket.timeout:
            self.disconnect()
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            self.disconnect()
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            self.disconnect()  # a part of the command may be written: never reuse it
            raise
        return self.read_response()


def pack(args: list[bytes]) -> bytes:
    """One command in the Redis protocol (RESP), its arguments already bytes."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(parts)


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
