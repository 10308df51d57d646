"""WebSocket adapter: ``/proto/websocket``, one JSON text frame per message both ways,
on the ``websockets`` library's threading client (cooperative under gevent's
monkey-patching, which makes its threads greenlets and its sockets gevent sockets)."""

from __future__ import annotations

import socket
import threading

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from ._http import BaseURL, CloseHandler, FrameHandler, bearer, failed, refused


class WSConnection:
    transport = "ws"
    confirms_on_send = False  # a sent frame may be lost with the connection

    def __init__(self, base: BaseURL, token: str | None, *, session: str | None,
                 last_seq: int | None, first: list[bytes], on_frame: FrameHandler,
                 on_close: CloseHandler, timeout: float, max_body: int) -> None:
        self.session_id = session
        self._on_frame, self._on_close = on_frame, on_close
        # The token goes in the Authorization header, not the URL (proxies log URLs).
        url = base.ws("/proto/websocket", {"session": session, "last_seq": last_seq})
        try:
            # entered as a context manager, as websockets 17 wants; heartbeats are the
            # protocol's PING/PONG, so the library's own pings are off
            self.ws = connect(url, additional_headers=bearer(token), open_timeout=timeout,
                              max_size=None, compression=None, ping_interval=None,
                              proxy=None, close_timeout=2).__enter__()
        except InvalidStatus as exc:
            raise refused(exc.response.status_code, exc.response.body or b"",
                          exc.response.headers.get("Retry-After")) from None
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise failed(exc, base) from None
        try:
            self.send(first)
        except ConnectionError:
            pass  # the reader reports the loss

    def start(self) -> None:
        """Start reading: after the client has made this its current connection."""
        threading.Thread(target=self._read, name="protoflask-ws-reader",
                         daemon=True).start()

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                data = self.ws.recv()
                self._on_frame(self, data.encode() if isinstance(data, str) else data)
        except ConnectionClosed as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - any failure ends this connection
            error = exc
        rcvd = self.ws.protocol.close_rcvd
        code = rcvd.code if rcvd is not None else None
        self._on_close(self, code, error)

    def send(self, frames: list[bytes]) -> None:
        try:
            for frame in frames:
                self.ws.send(frame.decode())
        except (ConnectionClosed, OSError) as exc:
            raise ConnectionError(f"websocket send failed: {exc}") from exc

    def close(self) -> None:
        self.ws.close()

    def abort(self) -> None:
        """Lose the connection abruptly, as a network failure would (tests, drills)."""
        try:
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.ws.close_socket()
