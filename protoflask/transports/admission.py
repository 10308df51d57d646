"""How a request for a live transport (WebSocket, SSE, NDJSON stream) is let in: its token
or connect ticket, the session it resumes and from which seq, checked by the engine.

The one admission path of the three transports: ``admit`` here, then
``Engine.session_for`` / ``Engine.open_transport`` (attach and log "open") and, however
the transport ends, ``Engine.end_transport``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Request

from ..auth import token_from_request

if TYPE_CHECKING:
    from ..engine import Admission, Engine


def admit(engine: "Engine", request: Request, kind: str, session_id: str | None,
          last_seq: int | None) -> "Admission":
    """Let a live transport of ``kind`` in with the request's token (``?token=`` or
    Bearer) or ``?ticket=``, or raise the contract's ProtoError (401, 404, 503). The
    caller owes the engine ``end_transport`` (or ``close_connection`` if it never got
    as far as a session)."""
    return engine.admit(
        token_from_request(request.args.get("token"), request.headers.get("Authorization")),
        session_id, last_seq, kind=kind, ticket=request.args.get("ticket"))
