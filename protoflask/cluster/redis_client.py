"""A redis-py client whose sockets are gevent's, whether or not the process is
monkey-patched (``ProtoServer.start()`` serves from a thread with its own gevent hub in a
plain program, where a stdlib socket would block every connection of that hub).

``pack`` and ``GeventConnection.execute_packed`` are the journal's short way through its
one command: packed by one join, written with ``send``, its reply (an array of integers)
read whole by ``int_array``, without redis-py's per-command machinery (the retry wrapper,
the observability hooks, its reply parser, gevent's ``sendall`` asking the socket's
buffer size every call): about 34k instructions per command instead of 205k. Errors are
redis-py's: a lost connection or a reply of another shape raises its ConnectionError
(the caller goes the long way, which reconnects and retries), an error reply the
ResponseError subclass redis-py's parser makes of it.
"""

from __future__ import annotations

import socket as stdlib_socket
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from gevent import socket as gsocket
from redis.sentinel import Sentinel, SentinelManagedConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..pins import check_redis

check_redis()  # GeventConnection reads redis-py's internals: fail here if they moved


class GeventConnection(redis.connection.Connection):
    def _connect(self) -> gsocket.socket:
        sock = gsocket.create_connection((self.host, self.port),
                                         timeout=self.socket_connect_timeout)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
        if self.socket_keepalive:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
        sock.settimeout(self.socket_timeout)
        return sock

    def execute_packed(self, command: bytes) -> list[int]:
        """Send one command ``pack`` made whose reply is an array of integers (the
        journal's script) and return it; an error reply raises as redis-py raises it.
        A socket failure or a reply of another shape drops the connection and raises
        redis-py's ConnectionError or TimeoutError (the next call connects again)."""
        if not self._sock:
            self.connect()
        sock: Any = self._sock
        try:
            sent = sock.send(command)  # (gevent waits for room, up to the socket timeout)
            if sent < len(command):
                view = memoryview(command)
                while sent < len(command):
                    sent += sock.send(view[sent:])
            data = sock.recv(RECV_SIZE)
            while True:
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                reply = int_array(data)
                if reply is not None:
                    break
                data += sock.recv(RECV_SIZE)
        except stdlib_socket.timeout:
            self.disconnect()
            raise RedisTimeoutError("Timeout on the socket") from None
        except OSError as exc:
            self.disconnect()
            raise RedisConnectionError(f"Error on the socket: {exc}") from exc
        except BaseException:
            self.disconnect()  # a part of the command may be written: never reuse it
            raise
        if isinstance(reply, str):
            error = self._parser.parse_error(reply)
            if isinstance(error, RedisConnectionError):
                self.disconnect()
            raise error
        return reply


RECV_SIZE = 65536


def int_array(data: bytes) -> list[int] | str | None:
    """A whole RESP reply that is an array of integers (the list), or an error (its
    text); None while incomplete. Raises ConnectionError for anything else."""
    if not data.endswith(b"\r\n"):
        return None
    lines = data.split(b"\r\n")
    head = lines[0]
    if head[:1] == b"-" and len(lines) == 2:
        return head[1:].decode("utf-8", errors="replace")
    if head[:1] == b"*" and head[1:].isdigit():
        items = lines[1:-1]
        if len(items) < int(head[1:]):
            return None
        if len(items) == int(head[1:]) and all(i[:1] == b":" for i in items):
            try:
                return [int(i[1:]) for i in items]
            except ValueError:
                pass
    raise RedisConnectionError(f"unexpected reply from Redis: {data[:100]!r}")


def pack(args: list[bytes], head: bool = True) -> bytes:
    """One command in the Redis protocol (RESP), its arguments already bytes; without
    ``head``, only its arguments (parts of a command packed piecewise)."""
    parts = [b"*%d\r\n" % len(args)] if head else []
    for arg in args:
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(parts)


class GeventSentinelConnection(SentinelManagedConnection, GeventConnection):
    """A connection to whichever server the sentinels name master now (it asks them
    again after a failover), on gevent's sockets, with the journal's short way."""


SENTINEL_SCHEME = "redis+sentinel://"


def sentinel_client(url: str, timeout: float) -> redis.Redis:
    """``redis+sentinel://[:password@]host:port[,host:port...]/master_name[/db]``: the
    master that Redis Sentinel names, found again after a failover."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) if userinfo else None
    sentinels: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        sentinels.append((name, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or not sentinels:
        raise ValueError(f"{SENTINEL_SCHEME} URL needs host:port and /master_name")
    db = int(path[1]) if len(path) > 1 else 0
    sentinel = Sentinel(sentinels, socket_timeout=timeout,
                        sentinel_kwargs={"socket_timeout": timeout,
                                         "socket_connect_timeout": timeout})
    client: redis.Redis = sentinel.master_for(
        path[0], connection_class=GeventSentinelConnection, socket_timeout=timeout,
        socket_connect_timeout=timeout, health_check_interval=0, db=db, password=password,
        max_connections=POOL_MAX)
    return client


#: connections a worker's pool may open: as many as its greenlets have commands waiting
#: (redis-py before 6 read None as 2**31; from 6 on None is 100, and a storm of 100
#: handshakes in flight, each waiting on a command while the beat, the listener and the
#: journal hold theirs, raised MaxConnectionsError, a ConnectionError: the node took
#: itself for cut off and copied every session over again; docs/PERFORMANCE.md p7-storm)
POOL_MAX = 2**31


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client for ``url`` (redis://host:port/db, or a Sentinel's master:
    ``sentinel_client``); nothing is connected until first use."""
    if url.startswith(SENTINEL_SCHEME):
        return sentinel_client(url, timeout)
    pool = redis.ConnectionPool.from_url(
        url, connection_class=GeventConnection, socket_connect_timeout=timeout,
        socket_timeout=timeout, health_check_interval=0, max_connections=POOL_MAX)
    return redis.Redis(connection_pool=pool)


def display_url(url: str) -> str:
    """``url`` as it may be logged or shown in /health: its password replaced by ``***``
    (``redis://:secret@host`` and ``redis://user:secret@host`` alike)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def text(reply: bytes | str) -> str:
    """A Redis reply as text (this client's replies are bytes: no decode_responses)."""
    return reply.decode() if isinstance(reply, bytes) else reply


#: What a lost or refused Redis connection raises (the cluster then runs degraded).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, OSError)
