"""How a request for a live transport (WebSocket, SSE, NDJSON stream) is let in: its token
or connect ticket, the session it resumes and from which seq, checked by the session
layer.

The one admission path of the three transports: ``admit`` here, then ``Ports.port`` (the
session's port, attached by the transport with ``SessionPort.attach``) and, however the
transport ends, ``SessionPort.end`` (``Ports.abandon`` if it never got a port)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Request

from ..auth import token_from_request

if TYPE_CHECKING:
    from ..port import Admission, Ports


def admit(ports: "Ports", request: Request, kind: str, session_id: str | None,
          last_seq: int | None) -> "Admission":
    """Let a live transport of ``kind`` in with the request's token (``?token=`` or
    Bearer) or ``?ticket=``, or raise the contract's ProtoError (401, 404, 503)."""
    return ports.admit(
        token_from_request(request.args.get("token"), request.headers.get("Authorization")),
        session_id, last_seq, kind, ticket=request.args.get("ticket"))
