"""``/proto/mcp``: the MCP Streamable HTTP transport (docs/MCP.md) on the adapters' ports
(``port.AdapterPorts``).

    POST   /proto/mcp   one JSON-RPC message; a request is answered with JSON, or with
                        an SSE stream when a tools/call carries a progress token
    GET    /proto/mcp   the session's stream of server notifications (tools/list_changed)
    DELETE /proto/mcp   ends the MCP session (its protoflask session is then kept for
                        replayWindowTime like any disconnected one)

Every request carries the user's token (``Authorization: Bearer``, or ``?token=`` /
``?ticket=`` for a client that cannot set headers); ``Mcp-Session-Id`` is the
protoflask session's id, so a request may land on any node of a cluster.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple
from urllib.parse import parse_qsl

import gevent.event
import gevent.lock
import orjson
from flask import Blueprint, Response, request

from ..auth import token_from_request
from ..core.errors import MessageTooLarge, MissingToken, ProtoError, SessionNotFound
from ..origins import OriginPolicy, normalize_origin
from ..transports.request_body import read_body
from . import task_calls, wire
from .link import McpLink

if TYPE_CHECKING:
    from ..port import AdapterPorts, SessionPort

#: How long an MCP session's link lives without a request (then the session is kept
#: for replayWindowTime, and a request after that is 404: the client initializes again)
IDLE_SECONDS = 300.0
#: Longest pause between two writes on the GET stream
KEEPALIVE_SECONDS = 15.0
#: JSON-RPC ids longer than this (as JSON) name their call by a hash
MAX_PLAIN_ID = 200
#: The requests served besides initialize and tasks/* (2025-11-25 sessions)
SERVED = frozenset({"ping", "tools/list", "tools/call"})
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Answer(NamedTuple):
    """An HTTP answer before any web framework shapes it (Flask's route and protoflask's
    own app's lane, post_lane.py, both send it)."""

    status: int
    body: bytes | Iterator[bytes]
    mimetype: str | None = "application/json"
    headers: dict[str, str] | None = None

    @property
    def streamed(self) -> bool:
        return not isinstance(self.body, bytes)

    def response(self) -> Response:
        return Response(self.body, status=self.status, mimetype=self.mimetype,
                        headers=self.headers)


class Req:
    """What a request to /proto/mcp is read for, from its WSGI environ."""

    __slots__ = ("environ", "_args")

    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self._args: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        value: str | None = self.environ.get("HTTP_" + name.upper().replace("-", "_"))
        return value

    def arg(self, name: str) -> str | None:
        if self._args is None:
            query = self.environ.get("QUERY_STRING", "")
            self._args = dict(reversed(parse_qsl(query))) if query else {}
        return self._args.get(name)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status, orjson.dumps(body), "application/json", headers)


def _rpc_error(request_id: Any, exc: wire.RpcError, status: int = 200) -> Answer:
    return _json(wire.error(request_id, exc), status)


def _http_error(exc: ProtoError) -> Answer:
    headers = {"WWW-Authenticate": 'Bearer realm="protoflask"'} \
        if exc.http_status == 401 else None
    return _json(exc.to_http_body(), exc.http_status, headers)


ACCEPTED = Answer(202, b"", None)


def _sse(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"


def call_id_for(request_id: Any) -> str:
    """The TOOL_CALL call_id of a tools/call request: derived from its JSON-RPC id, so a
    cancellation names the call on any node without a lookup (a long id by its hash)."""
    text = orjson.dumps(request_id).decode()
    if len(text) > MAX_PLAIN_ID:
        return "mcp:sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return "mcp:" + text


class McpEndpoint:
    """The MCP sessions of this process and the three routes."""

    def __init__(self, ports: "AdapterPorts", allowed_origins: "Iterable[str]") -> None:
        self.ports = ports
        self.origins = OriginPolicy(allowed_origins)
        self.links: dict[str, McpLink] = {}
        #: how long a task's result is kept: its TOOL_DONE's time in the replay window
        self.ttl_ms = ports.config.replay_window_time
        self._linking = gevent.lock.Semaphore()

    # -- checks every request meets ---------------------------------------------------------

    def origin_allowed(self, req: Req) -> bool:
        """The MCP specification's DNS-rebinding guard: a browser's Origin must be in
        allowedOrigins, or (with no list) be the origin the request was sent to."""
        origin = req.header("Origin")
        if origin is None:
            return True
        if self.origins.restricted:
            return self.origins.allows(origin)
        scheme = req.environ.get("wsgi.url_scheme", "http")
        try:
            host = normalize_origin(origin).split("://", 1)[1]
            own = normalize_origin(f"{scheme}://{req.header('Host')}").split("://", 1)[1]
        except ValueError:
            return False
        return host == own

    def user(self, req: Req) -> str:
        token = token_from_request(req.arg("token"), req.header("Authorization"))
        ticket = req.arg("ticket")
        if not token and not ticket:
            raise MissingToken("a Bearer token is required")
        return self.ports.user(token, ticket)

    # -- the session's link in this process ---------------------------------------------------

    def link_for(self, session_id: str, user_id: str) -> McpLink:
        """This process's link to the session, made (taking the session over from another
        node if need be) when there is none. SESSION_NOT_FOUND is the 404 MCP asks for."""
        with self._linking:
            link = self.links.get(session_id)
            if link is not None and not link.closed:
                if link.port.user_id != user_id:
                    raise SessionNotFound(f"no session {session_id!r} for this user")
                return link
            port = self.ports.session(session_id, user_id, McpLink.kind)
            self.ports.connect(port)
            return self._open(port)

    def check_session(self, session_id: str, user_id: str) -> None:
        """SESSION_NOT_FOUND unless the user's session exists here or on another node:
        for what needs no session of its own (tools/list, the GET stream, DELETE), which
        therefore never takes a session over from the node that holds it."""
        link = self.links.get(session_id)
        if link is not None and not link.closed:
            if link.port.user_id == user_id:
                return
        elif self.ports.held(session_id, user_id, McpLink.kind) is not None:
            return
        else:
            record = self.ports.lookup(session_id) if session_id else None
            if record is not None and record.get("userId") == user_id:
                return
        raise SessionNotFound(f"no session {session_id!r} for this user")

    def _open(self, port: "SessionPort") -> McpLink:
        """The link of a session ``port`` (counted as a live transport): it serves the
        session from now on, with nothing replayed (``last_seq`` None)."""
        link = McpLink(port, IDLE_SECONDS, self._ended)
        self.links[port.id] = link
        port.attach(link)  # the link serves the session from now on
        return link

    def _ended(self, link: McpLink) -> None:
        if self.links.get(link.session_id) is link:
            del self.links[link.session_id]

    # -- routes -------------------------------------------------------------------------------

    def post(self, environ: dict[str, Any]) -> Answer:
        """POST /proto/mcp, from the WSGI environ."""
        req = Req(environ)
        if not self.origin_allowed(req):
            return _rpc_error(None, wire.RpcError(wire.INVALID_REQUEST,
                                                  "Origin not allowed"), 403)
        try:
            user_id = self.user(req)
            limits = self.ports.limits
            body = read_body(environ, limits.max_message_size, limits.body_timeout)
        except MessageTooLarge as exc:
            return _rpc_error(None, wire.RpcError(wire.INVALID_REQUEST, exc.message), 413)
        except ProtoError as exc:
            return _http_error(exc)
        try:
            message = wire.parse_message(body)
        except wire.RpcError as exc:
            return _rpc_error(None, exc, 400)
        method, request_id = message.get("method"), message.get("id")
        if method is None:  # a response to a request of ours: none are sent
            return ACCEPTED
        params = message.get("params") or {}
        try:
            if method == "initialize":
                return self._initialize(user_id, request_id, params)
            if "id" in message and method not in SERVED and not method.startswith("tasks/"):
                # before any session rule: a 2026-07-28 client's server/discover probe (no
                # session, a revision not served) learns here to fall back to initialize
                raise wire.RpcError(wire.METHOD_NOT_FOUND, f"method not found: {method}")
            session_id = req.header(SESSION_HEADER)
            if not session_id:
                raise wire.RpcError(wire.INVALID_REQUEST, f"the {SESSION_HEADER} header is "
                                    "required after initialize")
            version = req.header(VERSION_HEADER) or wire.DEFAULT_VERSION
            if version not in wire.VERSIONS:
                raise wire.RpcError(wire.INVALID_REQUEST, f"unsupported {VERSION_HEADER} "
                                    f"{version!r}; served: {', '.join(wire.VERSIONS)}")
            if "id" not in message:
                return self._notification(method, params, session_id, user_id)
            return self._request(method, request_id, params, session_id, user_id, version,
                                 "text/event-stream" in (req.header("Accept") or ""))
        except wire.RpcError as exc:
            return _rpc_error(request_id, exc, 400 if exc.code == wire.INVALID_REQUEST else 200)
        except ProtoError as exc:
            if isinstance(exc, SessionNotFound):
                return _rpc_error(request_id, wire.RpcError(wire.INVALID_REQUEST,
                                                            str(exc.message)), 404)
            return _http_error(exc)

    def _initialize(self, user_id: str, request_id: Any, params: dict[str, Any]) -> Answer:
        if request_id is None:
            raise wire.RpcError(wire.INVALID_REQUEST, "initialize is a request")
        version = wire.negotiate(params.get("protocolVersion"))
        port = self.ports.create(user_id, McpLink.kind, connect=True)
        with self._linking:
            link = self._open(port)
        link.hello()
        return _json(wire.result(request_id, wire.initialize_result(version)),
                     headers={SESSION_HEADER: port.id})

    def _notification(self, method: str, params: dict[str, Any], session_id: str,
                      user_id: str) -> Answer:
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            if request_id is not None:
                self.link_for(session_id, user_id).cancel(call_id_for(request_id))
        return ACCEPTED  # initialized, progress, roots: nothing to do

    def _request(self, method: str, request_id: Any, params: dict[str, Any],
                 session_id: str, user_id: str, version: str, sse: bool) -> Answer:
        if method == "ping":
            return _json(wire.result(request_id, {}))
        if method == "tools/list":
            self.check_session(session_id, user_id)
            tools = [tool.to_dict() for tool in self.ports.tools]
            return _json(wire.result(request_id, wire.tool_listing(tools, version)))
        if method == "tools/call":
            return self._call(request_id, params, session_id, user_id, version, sse)
        if method.startswith("tasks/") and wire.at_least(version, wire.TASKS_SINCE):
            return _json(self._task(method, request_id, params,
                                    self.link_for(session_id, user_id), version))
        raise wire.RpcError(wire.METHOD_NOT_FOUND, f"method not found: {method}")

    def _call(self, request_id: Any, params: dict[str, Any], session_id: str, user_id: str,
              version: str, sse: bool) -> Answer:
        name = params.get("name")
        if not isinstance(name, str):
            raise wire.RpcError(wire.INVALID_PARAMS, "tools/call needs a tool name")
        arguments = params.get("arguments")
        arguments = {} if arguments is None else arguments
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        link = self.link_for(session_id, user_id)
        if isinstance(params.get("task"), dict) and wire.at_least(version, wire.TASKS_SINCE):
            return _json(task_calls.start(link, request_id, name, arguments, self.ttl_ms,
                                          _answer, version))
        call_id = call_id_for(request_id)
        queue = link.start_call(call_id, name, arguments)
        if token is None or not sse:
            try:
                while True:
                    kind, payload = queue.get()
                    if kind != "update":
                        return _json(_answer(request_id, kind, payload, version))
            finally:
                link.forget(call_id)
        return Answer(200, self._stream(link, call_id, queue, request_id, token, version),
                      "text/event-stream", SSE_HEADERS)

    def _task(self, method: str, request_id: Any, params: dict[str, Any], link: McpLink,
              version: str) -> dict[str, Any]:
        if method == "tasks/get":
            return task_calls.get(link, request_id, params, self.ttl_ms)
        if method == "tasks/result":
            return task_calls.result(link, request_id, params, _answer, version)
        if method == "tasks/cancel":
            return task_calls.cancel(link, request_id, params, self.ttl_ms)
        if method == "tasks/list":
            return task_calls.listing(link, request_id, self.ttl_ms)
        raise wire.RpcError(wire.METHOD_NOT_FOUND, f"method not found: {method}")

    @staticmethod
    def _stream(link: McpLink, call_id: str, queue: Any, request_id: Any, token: Any,
                version: str) -> Iterator[bytes]:
        """The SSE response of a tools/call with a progress token: its progress, then
        its answer. A client that leaves does not cancel the call (MCP: disconnecting is
        not cancelling; notifications/cancelled is)."""
        last = -1.0
        try:
            while True:
                kind, payload = queue.get()
                if kind == "update":
                    note, last = wire.progress(token, payload, last)
                    if note is not None:
                        yield _sse(note)
                    continue
                if kind != "done" or payload.get("status") != "CANCELLED":
                    yield _sse(_answer(request_id, kind, payload, version))
                return  # a cancelled request gets no response (MCP cancellation)
        finally:
            link.forget(call_id)

    def get(self, environ: dict[str, Any]) -> Answer:
        """The server-to-client stream: notifications/tools/list_changed."""
        req = Req(environ)
        if not self.origin_allowed(req):
            return _rpc_error(None, wire.RpcError(wire.INVALID_REQUEST,
                                                  "Origin not allowed"), 403)
        if "text/event-stream" not in (req.header("Accept") or ""):
            return _json({"error": {"code": "INVALID_MESSAGE", "message":
                                    "GET /proto/mcp is an event stream"}}, 406)
        try:
            user_id = self.user(req)
            self.check_session(req.header(SESSION_HEADER) or "", user_id)
        except ProtoError as exc:
            return _http_error(exc)
        changed = gevent.event.Event()
        listeners = self.ports.tools.listeners
        listeners.append(changed.set)
        return Answer(200, _notifications(changed, lambda: listeners.remove(changed.set)),
                      "text/event-stream", SSE_HEADERS)

    def delete(self, environ: dict[str, Any]) -> Answer:
        req = Req(environ)
        if not self.origin_allowed(req):
            return _rpc_error(None, wire.RpcError(wire.INVALID_REQUEST,
                                                  "Origin not allowed"), 403)
        try:
            user_id = self.user(req)
            session_id = req.header(SESSION_HEADER) or ""
            self.check_session(session_id, user_id)
            link = self.links.get(session_id)
            if link is not None:  # held here: let it go (elsewhere its link idles out)
                link.close(1000, "MCP session ended")
        except ProtoError as exc:
            return _http_error(exc)
        return Answer(200, b"", None)


def _answer(request_id: Any, kind: str, payload: Any, version: str) -> dict[str, Any]:
    """The JSON-RPC answer to a tools/call from what ended it."""
    if kind == "done":
        error = payload.get("error") or {}
        if error.get("code") == "TOOL_NOT_FOUND":  # MCP: an unknown tool is a protocol error
            return wire.error(request_id, wire.RpcError(wire.INVALID_PARAMS,
                                                        error.get("message", "unknown tool")))
        return wire.result(request_id, wire.call_result(payload, version))
    if kind == "refused":
        return wire.result(request_id, wire.refused_result(payload))
    return wire.error(request_id, wire.RpcError(wire.CONNECTION_CLOSED, str(payload)))


def _notifications(changed: gevent.event.Event, done: Callable[[], None]) -> Iterator[bytes]:
    try:
        yield b": stream open\n\n"
        while True:
            if changed.wait(timeout=KEEPALIVE_SECONDS):
                changed.clear()
                yield _sse(wire.notification("notifications/tools/list_changed"))
            else:
                yield b": keepalive\n\n"
    finally:
        done()


def add_mcp_routes(bp: Blueprint, endpoint: McpEndpoint) -> None:
    """Mount /proto/mcp on the blueprint (on protoflask's own app, post_lane.py answers
    its POSTs in front of Flask with the same Answer)."""
    def route(handle: Callable[[dict[str, Any]], Answer]) -> Callable[[], Response]:
        def view() -> Response:
            return handle(request.environ).response()
        return view

    bp.add_url_rule("/proto/mcp", "mcp_post", route(endpoint.post), methods=["POST"])
    bp.add_url_rule("/proto/mcp", "mcp_get", route(endpoint.get), methods=["GET"])
    bp.add_url_rule("/proto/mcp", "mcp_delete", route(endpoint.delete), methods=["DELETE"])


