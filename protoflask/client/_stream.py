"""HTTP-stream adapter: ``POST /proto/stream`` whose body carries the first messages
(the HELLO) and whose ``application/x-ndjson`` response is the session's downstream, one
envelope per line; later messages are follow-up POSTs (``?session=<id>`` → 202). A
resume is the same POST with ``&last_seq=<n>``.

The one-shot body plus follow-ups works through any HTTP/1.1 proxy, which a chunked
full-duplex body does not (docs/PROTOCOL-http.md §5)."""

from __future__ import annotations

import http.client
import threading

from ._http import (
    BaseURL, CloseHandler, FrameHandler, Upstream, bearer, failed, refused, shutdown,
)


class StreamConnection:
    transport = "stream"
    confirms_on_send = True

    def __init__(self, base: BaseURL, token: str | None, *, session: str | None,
                 last_seq: int | None, first: list[bytes], on_frame: FrameHandler,
                 on_close: CloseHandler, timeout: float, max_body: int) -> None:
        self._on_frame, self._on_close = on_frame, on_close
        path = base.path("/proto/stream", {"session": session, "last_seq": last_seq})
        headers = {"Content-Type": "application/x-ndjson", **bearer(token)}
        self.conn: http.client.HTTPConnection | None = None
        try:
            self.conn = base.http(timeout)
            # The response head comes with its first line: the HELLO reply at the latest.
            self.conn.request("POST", path, b"\n".join(first), headers)
            # the socket, kept: getresponse() drops conn.sock for a `Connection: close` answer
            sock = self.conn.sock
            self.resp = self.conn.getresponse()
            if self.resp.status != 200:
                raise refused(self.resp.status, self.resp.read(),
                              self.resp.getheader("Retry-After"))
        except (OSError, http.client.HTTPException) as exc:
            shutdown(self.conn)
            raise failed(exc, base) from None
        except BaseException:
            shutdown(self.conn)
            raise
        self.session_id = self.resp.getheader("Proto-Session") or session or ""
        sock.settimeout(None)
        self.upstream = Upstream(base, "/proto/stream", token, self.session_id, max_body,
                                 timeout)

    def start(self) -> None:
        """Start reading: after the client has made this its current connection."""
        threading.Thread(target=self._read, name="protoflask-stream-reader",
                         daemon=True).start()

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    break
                line = line.strip()
                if line:
                    self._on_frame(self, line)
        except Exception as exc:  # noqa: BLE001 - any failure ends this connection
            error = exc
        self.upstream.close()
        if self.conn is not None:
            self.conn.close()
        self._on_close(self, None, error)

    def send(self, frames: list[bytes]) -> None:
        self.upstream.post(frames)

    def close(self) -> None:
        shutdown(self.conn, close=False)  # the reader closes it

    abort = close
