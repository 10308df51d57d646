"""Server-Sent Events transport (docs/PROTOCOL-http.md §3): frames a session's downstream as events.

    GET  /proto/sse?token=...            -> text/event-stream, the session's downstream
    POST /proto/sse?session=<id>         -> 202 {"accepted": n}, the upstream

Framing only: the first event of every stream (new or resumed) is ``event: session`` with
``data: {"session": "<id>"}`` and no ``id:`` line, so a browser's Last-Event-ID always
names a protocol message; every protocol message is a default event with
``id: <session>:<seq>`` and its envelope JSON on one ``data:`` line; an idle stream gets a
``: keepalive`` comment; a stream the server ends (CloseRequested, heartbeat timeout,
superseded by a resume, server stopping) ends with ``event: close`` carrying
``{"code", "reason"}``, the WebSocket close code the other transport would use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import orjson
from flask import Request, Response

from ..auth import token_from_request
from ..core.bodies import is_seq, parse_seq_arg
from ..core.errors import InvalidMessage, ProtoError
from .http import HTTPDownstream, error_response
from .http import post_messages as post_messages  # POST /proto/sse is the shared upstream

if TYPE_CHECKING:
    from ..port import Ports


class SSEStream(HTTPDownstream):
    kind = "sse"
    mimetype = "text/event-stream"

    def preamble(self) -> bytes:
        return b"event: session\ndata: " + orjson.dumps({"session": self.port.id}) + b"\n\n"

    _id: bytes = b""  # "id: <session>:", the start of every message's event

    def frame(self, seq: int, data: bytes) -> bytes:
        return b"id: %s:%d\ndata: %s\n\n" % (self.port.id.encode(), seq, data)

    def frames(self, ready: list[tuple[int, bytes]]) -> bytes:
        head = self._id or self._event_head()
        return b"".join([b"%s%d\ndata: %s\n\n" % (head, seq, data) for seq, data in ready])

    def _event_head(self) -> bytes:
        self._id = b"id: %s:" % self.port.id.encode()
        return self._id

    def keepalive_frame(self) -> bytes:
        return b": keepalive\n\n"

    def closing_frame(self, code: int, reason: str) -> bytes:
        return b"event: close\ndata: " + orjson.dumps({"code": code, "reason": reason}) + b"\n\n"


def resume_point(args: Mapping[str, str], last_event_id: str) -> tuple[str | None, int | None]:
    """(session, last_seq) from the query or from the Last-Event-ID header.

    The header is what a browser sends on its own when it reconnects; for the session the
    query names (or, without one, for the header's session) it wins over ``last_seq`` in
    the query, being the newer of the two."""
    session_id = args.get("session") or None
    last_seq = parse_seq_arg(args.get("last_seq"), "last_seq")
    header = last_event_id.strip()
    if header:
        sid, sep, seq = header.rpartition(":")
        if not sep or not sid or not is_seq(seq):
            raise InvalidMessage(f"Last-Event-ID must be <session>:<seq>, got {header[:80]!r}")
        if session_id is None or session_id == sid:
            session_id, last_seq = sid, int(seq)
    return session_id, last_seq


def open_downstream(ports: "Ports", args: Mapping[str, str], authorization: str | None,
                    last_event_id: str, environ: dict[str, Any]) -> SSEStream:
    """GET /proto/sse: a new session's stream, or a resumed one; or the contract's
    ProtoError. Flask's route (``stream_response``) and protoflask's own app's lane
    (post_lane.py, ``SSEStream.wsgi_app``) both open streams with this."""
    session_id, last_seq = resume_point(args, last_event_id)
    admission = ports.admit(token_from_request(args.get("token"), authorization), session_id,
                            last_seq, SSEStream.kind, ticket=args.get("ticket"))
    return SSEStream(ports.port(admission, SSEStream.kind), environ)


def stream_response(ports: "Ports", args: Mapping[str, str], authorization: str | None,
                    last_event_id: str, environ: dict[str, Any]) -> Response:
    """``open_downstream``'s stream as a Flask response."""
    return open_downstream(ports, args, authorization, last_event_id, environ).response()


def open_stream(ports: "Ports", request: Request) -> Response:
    """GET /proto/sse as a Flask response (see ``stream_response``)."""
    try:
        return stream_response(ports, request.args, request.headers.get("Authorization"),
                               request.headers.get("Last-Event-ID", ""), request.environ)
    except ProtoError as exc:
        return error_response(exc)
