"""The AG-UI run's event stream (docs/AGUI.md): a live HTTP transport of the session that
holds the run's thread. Like the transports, it holds one narrow thing, its
``port.SessionPort``, and imports nothing else of the session layer
(tests/test_layers.py); the endpoint (``agui/endpoint.py``) admits the run and gives it
its port.

The stream frames what the session sends through a ``RunTranslator`` and ends after the
run's terminal event; the heartbeat's PINGs it answers itself, upstream through its port
(AG-UI clients know nothing of them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ..clock import now_ms
from ..transports.http import HTTPDownstream
from .mapping import RunTranslator

if TYPE_CHECKING:
    from ..port import SessionPort

#: Live transports of this kind count against the connection limits like the others.
KIND = "agui"


def native_message(session_id: str, seq: int, mtype: str, channel: str,
                   payload: dict[str, Any]) -> bytes:
    """A native message from the AG-UI client's side, as the session reads it."""
    return orjson.dumps({
        "id": f"agui-{seq}", "session": session_id, "seq": str(seq), "ts": str(now_ms()),
        "type": mtype, "channel": channel, "payload": payload})


class AguiStream(HTTPDownstream):
    """One AG-UI run's event stream (see the module doc)."""

    kind = KIND
    mimetype = "text/event-stream"

    def __init__(self, port: "SessionPort", environ: dict[str, Any],
                 translator: RunTranslator) -> None:
        super().__init__(port, environ)
        self.translator = translator

    def frames(self, ready: list[tuple[int, bytes]]) -> bytes:
        translator = self.translator
        if translator.ended:
            return b""
        out = translator.translate(ready)
        if translator.pings:
            port = self.port
            for nonce in translator.pings:  # PONG, from the client's side
                port.receive(native_message(port.id, port.upstream_seq + 1, "PONG",
                                            "SYSTEM", {"nonce": nonce}))
            translator.pings.clear()
        if translator.ended:
            self.close(1000, "run ended")  # the body closes after the terminal event
        return out

    def frame(self, seq: int, data: bytes) -> bytes:
        return self.frames([(seq, data)])

    def keepalive_frame(self) -> bytes:
        return b": keepalive\n\n"
