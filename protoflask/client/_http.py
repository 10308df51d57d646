"""What the SSE and HTTP-stream adapters share: URLs, HTTP errors as ConnectionRefused,
and the upstream POSTs (``POST <path>?session=<id>``, NDJSON body, ``202``)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import Callable
from urllib.parse import urlencode, urlsplit

import orjson

from .errors import ConnectionFailed, ConnectionRefused

#: on_frame(connection, envelope bytes) and on_close(connection, close code or None, error)
FrameHandler = Callable[[object, bytes], None]
CloseHandler = Callable[[object, "int | None", "BaseException | None"], None]


class BaseURL:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https", "ws", "wss"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}")
        self.secure = parts.scheme in ("https", "wss")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.secure else 80)
        self.prefix = parts.path.rstrip("/")

    def http(self, timeout: float | None) -> http.client.HTTPConnection:
        """A connected HTTPConnection with Nagle off: http.client writes a request's head
        and body separately, and Nagle would hold the body until the server's delayed ACK
        of the head (~40 ms per POST)."""
        cls = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def ws(self, path: str, query: dict[str, object]) -> str:
        scheme = "wss" if self.secure else "ws"
        return f"{scheme}://{self.host}:{self.port}{self.prefix}{path}{query_string(query)}"

    def path(self, path: str, query: dict[str, object] | None = None) -> str:
        return f"{self.prefix}{path}{query_string(query or {})}"


def query_string(params: dict[str, object]) -> str:
    clean = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(clean) if clean else ""


def refused(status: int, body: bytes | bytearray,
            retry_after: str | None = None) -> ConnectionRefused:
    """An HTTP error response as ConnectionRefused with the contract's JSON error code
    (and its Retry-After header's seconds, if any)."""
    code, message = f"HTTP_{status}", ""
    try:
        err = orjson.loads(body)["error"]
        code, message = str(err["code"]), str(err.get("message", ""))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    seconds: float | None = None
    try:
        seconds = min(float(retry_after), MAX_RETRY_AFTER) if retry_after else None
    except ValueError:
        pass  # an HTTP date: the client's own backoff
    return ConnectionRefused(status, code, message, seconds)


def failed(exc: BaseException, base: BaseURL) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach {base.host}:{base.port}: {exc}")


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def shutdown(conn: http.client.HTTPConnection | None, close: bool = True) -> None:
    """Drop a connection at once (no graceful end): its reader sees EOF. With
    ``close=False`` the reader closes it when it sees that (closing a response another
    thread or greenlet is reading raises "reentrant call" in the reader)."""
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    if conn is not None and close:
        conn.close()


#: the longest a Retry-After is followed (a server asking more is asking for a backoff)
MAX_RETRY_AFTER = 5.0
#: how long a POST answered 503 (a cluster routing the session just now) is retried
RETRY_503_FOR = 60.0


class Upstream:
    """Messages to a session by POST, one keep-alive connection, bodies of NDJSON kept
    under ``max_body`` bytes (a larger body would be refused with 413). A 202 means the
    session has seen every message of the body."""

    def __init__(self, base: BaseURL, path: str, token: str | None, session_id: str,
                 max_body: int, timeout: float) -> None:
        self.base, self.token, self.max_body, self.timeout = base, token, max_body, timeout
        self.target = base.path(path, {"session": session_id})
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def post(self, frames: list[bytes]) -> None:
        batch: list[bytes] = []
        size = 0
        for frame in frames:
            if batch and size + len(frame) + 1 > self.max_body:
                self._post(b"\n".join(batch))
                batch, size = [], 0
            batch.append(frame)
            size += len(frame) + 1
        if batch:
            self._post(b"\n".join(batch))

    def _post(self, body: bytes) -> None:
        """POST the body; a 503 (a cluster that cannot route the session just now: its
        node reconnecting to Redis, say) is retried after its Retry-After for up to
        RETRY_503_FOR seconds rather than ending the connection."""
        give_up = time.monotonic() + RETRY_503_FOR
        while True:
            try:
                return self._post_once(body)
            except ConnectionRefused as exc:
                if exc.status != 503 or time.monotonic() > give_up:
                    raise
                time.sleep(exc.retry_after or 1.0)

    def _post_once(self, body: bytes) -> None:
        headers = {"Content-Type": "application/x-ndjson", **bearer(self.token)}
        with self._lock:
            for attempt in (1, 2):  # a kept-alive connection the server closed: once more
                try:
                    if self._conn is None:
                        self._conn = self.base.http(self.timeout)
                    self._conn.request("POST", self.target, body, headers)
                    resp = self._conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    shutdown(self._conn)
                    self._conn = None
                    if attempt == 2 or not isinstance(
                            exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                  ConnectionResetError)):
                        raise ConnectionError(f"upstream POST failed: {exc}") from exc
                    continue
                if resp.status != 202:
                    raise refused(resp.status, data, resp.getheader("Retry-After"))
                return

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
