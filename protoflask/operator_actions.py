"""The dashboard's operator actions: disconnect a session, send a message to one, broadcast.

They exist only when ``operatorToken`` is set (off by default: the routes are not there,
so they answer 404 NOT_FOUND like any unknown path). The credential is that token, sent as
``Authorization: Bearer <operatorToken>`` and compared in constant time; a user's JWT is
not an operator credential. Routes (docs/PROTOCOL.md §11, docs/OPERATIONS.md):

    GET  /dashboard/operator                  {"operatorActions": true|false} (no
                                              credential; served with the dashboard):
                                              whether the page shows operator controls
    GET  /dashboard/operator/data             /dashboard/data listing every session and
                                              tool, as development mode does
    POST /dashboard/sessions/<id>/disconnect  close the session's live transport (1001)
    POST /dashboard/sessions/<id>/send        body: a message {type, channel, payload}
    POST /dashboard/broadcast                 body: a message, to every connected session

Disconnect closes the transport as ``close_all_connections`` does for every one: the
session stays for resume (docs/PROTOCOL.md §6.2), so a client that resumes comes back.
It acts on a session this worker holds; send and broadcast reach the whole cluster, as
``send_message`` and ``broadcast`` do.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any, Callable

import orjson
from flask import Blueprint, Response, g, request

from .auth import token_from_request
from .core import messages
from .core.bodies import is_seq
from .core.errors import (
    CloseCode, InvalidMessage, InvalidToken, MessageTooLarge, MissingToken, ProtoError,
    SessionNotFound,
)
from .dashboard import dashboard_data
from .live import Send
from .transports.http import error_response, json_response

if TYPE_CHECKING:
    from .engine import Engine

DISCONNECT_REASON = "disconnected by an operator"


def add_operator_routes(bp: Blueprint, engine: "Engine", operator_token: str | None,
                        max_body: int) -> None:
    """The operator's routes on ``bp`` (only ``GET /dashboard/operator`` without an
    ``operator_token``); bodies larger than ``max_body`` bytes (the server's
    maxMessageSize) are refused with 413 before they are parsed."""
    bp.add_url_rule("/dashboard/operator", "operator",
                    lambda: json_response({"operatorActions": operator_token is not None}))
    if operator_token is None:
        return
    expected = operator_token.encode("utf-8")

    def authorize() -> None:
        given = token_from_request(None, request.headers.get("Authorization"))
        if not given:
            raise MissingToken("operator actions need 'Authorization: Bearer "
                               "<operatorToken>'")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected):
            raise InvalidToken("not the operator token (a user's token is not one)")

    def message_body() -> messages.Outbound:
        if request.content_length is not None and request.content_length > max_body:
            raise MessageTooLarge(f"the body is larger than {max_body} bytes")
        raw = request.stream.read(max_body + 1)
        if len(raw) > max_body:
            raise MessageTooLarge(f"the body is larger than {max_body} bytes")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidMessage(f"the body is not JSON: {exc}") from None
        return messages.from_dict(body)  # INVALID_MESSAGE for anything but a message

    def action(fn: Callable[..., dict[str, Any]]) -> Callable[..., Response]:
        def run(**kwargs: Any) -> Response:
            try:
                authorize()
                return json_response(fn(**kwargs))
            except ProtoError as exc:
                return error_response(exc)
        run.__name__ = fn.__name__
        return run

    def data() -> dict[str, Any]:
        g.protoflask_quiet = True  # polled like /dashboard/data: not in the access log
        try:
            since = request.args.get("since") or "0"
        except UnicodeDecodeError:  # werkzeug raises on a query that is not UTF-8
            raise InvalidMessage("the query string is not UTF-8") from None
        if not is_seq(since):
            raise InvalidMessage(f"since must be a number of ms, got {since[:40]!r}")
        out = dashboard_data(engine, True, None, int(since))
        out["access"] = {"user": None, "devMode": engine.config.dev_mode,
                         "sessions": "all", "operator": True}
        return out

    def disconnect(session_id: str) -> dict[str, Any]:
        live = engine.hub.get(session_id)
        if live is None:
            elsewhere = engine.hub.lookup(session_id) is not None
            raise SessionNotFound(f"no session {session_id!r} on this worker" +
                                  (" (another node holds it)" if elsewhere else ""))
        connected = live.transport is not None
        engine.close_transport(live, CloseCode.GOING_AWAY, DISCONNECT_REASON)
        return {"session": session_id, "disconnected": connected}

    def send(session_id: str) -> dict[str, Any]:
        out = message_body()
        engine.deliver(session_id, Send(out))  # SESSION_NOT_FOUND if none
        return {"session": session_id, "sent": True}

    def broadcast() -> dict[str, Any]:
        return {"reached": engine.broadcast(message_body())}

    bp.add_url_rule("/dashboard/operator/data", "operator_data", action(data))
    bp.add_url_rule("/dashboard/sessions/<session_id>/disconnect", "operator_disconnect",
                    action(disconnect), methods=["POST"])
    bp.add_url_rule("/dashboard/sessions/<session_id>/send", "operator_send", action(send),
                    methods=["POST"])
    bp.add_url_rule("/dashboard/broadcast", "operator_broadcast", action(broadcast),
                    methods=["POST"])
