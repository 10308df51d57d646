"""Server-Sent Events adapter: ``GET /proto/sse`` read as an event stream (the first
event names the session; every protocol message is a default event with its envelope on
one ``data:`` line; a named ``close`` event carries the close code), upstream by
``POST /proto/sse?session=<id>``."""

from __future__ import annotations

import http.client
import threading

import orjson

from ._http import (
    BaseURL, CloseHandler, FrameHandler, Upstream, bearer, failed, refused, shutdown,
)


class SSEConnection:
    transport = "sse"
    confirms_on_send = True  # a 202 means the session saw the whole body

    def __init__(self, base: BaseURL, token: str | None, *, session: str | None,
                 last_seq: int | None, first: list[bytes], on_frame: FrameHandler,
                 on_close: CloseHandler, timeout: float, max_body: int) -> None:
        self._on_frame, self._on_close = on_frame, on_close
        path = base.path("/proto/sse", {"session": session, "last_seq": last_seq})
        self.conn: http.client.HTTPConnection | None = None
        try:
            self.conn = base.http(timeout)
            self.conn.request("GET", path, headers={"Accept": "text/event-stream",
                                                    **bearer(token)})
            # the socket, kept: getresponse() drops conn.sock for a `Connection: close` answer
            sock = self.conn.sock
            self.resp = self.conn.getresponse()
            if self.resp.status != 200:
                raise refused(self.resp.status, self.resp.read(),
                              self.resp.getheader("Retry-After"))
            event = self._next_event()
        except (OSError, http.client.HTTPException) as exc:
            shutdown(self.conn)
            raise failed(exc, base) from None
        except BaseException:
            shutdown(self.conn)
            raise
        if event is None or event[0] != "session":
            shutdown(self.conn)
            raise failed(ValueError("the event stream did not start with its session"), base)
        self.session_id = orjson.loads(event[1])["session"]
        sock.settimeout(None)  # a long-lived stream: idle is normal
        self.close_code: int | None = None
        self.upstream = Upstream(base, "/proto/sse", token, self.session_id, max_body, timeout)
        try:
            self.send(first)
        except ConnectionError as exc:
            shutdown(self.conn)
            raise failed(exc, base) from None
        except BaseException:
            shutdown(self.conn)
            raise

    def _next_event(self) -> tuple[str, bytes] | None:
        name, data = "message", b""
        while True:
            line = self.resp.readline()
            if not line:
                return None
            line = line.rstrip(b"\r\n")
            if not line:
                if data:
                    return name, data
                name = "message"
                continue
            if line.startswith(b":"):
                continue  # keep-alive comment
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"data":
                data = value if not data else data + b"\n" + value
            elif field == b"event":
                name = value.decode()

    def start(self) -> None:
        """Start reading: after the client has made this its current connection."""
        threading.Thread(target=self._read, name="protoflask-sse-reader",
                         daemon=True).start()

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                event = self._next_event()
                if event is None:
                    break
                if event[0] == "message":
                    self._on_frame(self, event[1])
                elif event[0] == "close":
                    self.close_code = orjson.loads(event[1]).get("code")
        except Exception as exc:  # noqa: BLE001 - any failure ends this connection
            error = exc
        self.upstream.close()
        if self.conn is not None:
            self.conn.close()
        self._on_close(self, self.close_code, error)

    def send(self, frames: list[bytes]) -> None:
        self.upstream.post(frames)

    def close(self) -> None:
        shutdown(self.conn, close=False)  # the reader closes it

    abort = close  # closing the event stream's socket is all a network failure does
