"""The Flask blueprint: /health, /stats, /metrics, the dashboard page and the transport
routes, plus the Origin allow-list, CORS, gzip for JSON responses and connection-level
access logs (never one line per message), and the debug-only /debug/vitals."""

from __future__ import annotations

import gzip
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import gevent
from flask import Blueprint, Response, g, request
from flask.sansio.app import App
from werkzeug.exceptions import HTTPException
from werkzeug.routing import WebsocketMismatch

from .agui.endpoint import add_agui_routes
from .agui.run import AguiServices
from .vitals import snapshot as vitals_snapshot
from .auth import token_from_request
from .core.bodies import parse_seq_arg
from .core.errors import InvalidMessage, OriginNotAllowed, ProtoError, ShuttingDown
from .dashboard import add_dashboard_routes
from .clock import now_ms
from .hub import cluster_stats
from .logs import redacted_query
from .mcp import McpEndpoint, add_mcp_routes
from .operator_actions import add_operator_routes
from .metrics import metrics_response
from .origins import OriginPolicy
from .pins import check_websockets
from .transports import sse, stream, websocket as ws
from .port import Ports
from .transports.admission import admit
from .transports.http import error_response, json_response
from .transports.sockets import hold_open, is_tls, let_go, raw_socket

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .config import ServerConfig
    from .engine import Engine
    from .port import AdapterPorts

access_log = logging.getLogger("protoflask.access")
# transports/websocket.py reads websockets' internals: fail here, at start-up, if they
# moved (the check belongs beside them; it is here until that module imports it)
check_websockets()

log = logging.getLogger("protoflask.web")

GZIP_MIN_BYTES = 100
#: The blueprint's name: its endpoints are "protoflask.<route>".
BLUEPRINT_NAME = "protoflask"
#: The endpoints an Origin outside allowedOrigins is refused on (403 ORIGIN_NOT_ALLOWED).
TRANSPORT_ENDPOINTS = frozenset({"protoflask.websocket", "protoflask.sse_stream",
                                 "protoflask.sse_post", "protoflask.http_stream",
                                 "protoflask.ticket", "protoflask.agui_run",
                                 "protoflask.agui_reattach", "protoflask.agui_stop"})
#: What the public /stats leaves out of each node of a cluster (where it runs).
PRIVATE_NODE_FIELDS = frozenset({"host", "pid"})
#: A Host header value: a name, an IPv4 address or a bracketed IPv6 address, and a port.
#: (Commas are refused: that is how a WSGI server joins two Host headers.)
_HOST = re.compile(r"([A-Za-z0-9._~!$&'()*+;=%-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{0,5})?\Z")


def valid_host(value: str | None) -> bool:
    """Whether a Host header is present and well formed (RFC 7230 5.4, RFC 6455 4.2.1)."""
    return bool(value) and _HOST.match(value) is not None  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class WebContext:
    """What the blueprint serves from, handed down by the server (which it never holds)."""

    engine: "Engine"
    config: "ServerConfig"
    #: what /metrics serves (the server's, with any collector the application added)
    metrics_registry: "CollectorRegistry"
    #: the Flask app is the server's own (not an application's): the page may take "/"
    #: and every error is answered as JSON
    own_app: bool
    #: /proto/mcp (docs/MCP.md): its routes here, its POSTs also in post_lane.py
    mcp: McpEndpoint
    #: what an AG-UI run needs of the server (docs/AGUI.md); None: no /proto/agui
    agui: Callable[[], AguiServices] | None = None
    #: what the adapters are given of the session layer (their routes: /proto/agui)
    adapters: "AdapterPorts | None" = None


class ConnectionTakenOver(StopIteration):
    """Ends the WSGI cycle of a request whose socket now belongs to a WebSocket.

    Gunicorn's async workers close the connection on StopIteration (as flask-sock relies
    on); protoflask's own gevent handler catches it too."""


class _TakenOverResponse(Response):
    def __call__(self, environ: Any, start_response: Any) -> Any:
        raise ConnectionTakenOver()


def create_blueprint(ctx: WebContext) -> Blueprint:
    bp = Blueprint(BLUEPRINT_NAME, __name__)
    engine = ctx.engine
    ports = Ports(engine)  # what the transports are given of the session layer
    view = engine.hub.view  # what only a cluster answers (None on one node)
    config = ctx.config
    origins = OriginPolicy(config.allowed_origins)
    bp.record_once(lambda state: install_error_handlers(state.app, ctx))

    @bp.before_request
    def _start_request() -> Response | None:
        """Start the access-log timer; refuse an Origin outside allowedOrigins, and a query
        string that is not UTF-8 (werkzeug's ``request.args`` raises on it: a 500)."""
        g.protoflask_started = time.perf_counter()
        if request.endpoint not in TRANSPORT_ENDPOINTS:
            return None
        if not origins.allows(request.headers.get("Origin")):
            return error_response(OriginNotAllowed(
                f"Origin {request.headers.get('Origin')!r} is not in allowedOrigins"))
        try:
            request.args.get("token")  # parses (and caches) the query
        except UnicodeDecodeError:
            return error_response(InvalidMessage("the query string is not UTF-8"))
        return None

    @bp.get("/health")
    def health() -> Response:
        stats = cluster_stats(view, engine.stats.snapshot(now_ms()))
        body = {
            "status": "draining" if engine.shutting_down
            else view.health() if view is not None else "ok",
            "uptime": stats["uptime"],
            "activeConnections": stats["activeConnections"],
            "totalConnections": stats["totalConnections"],
        }
        if "nodes" in stats:  # clustered: this node, and each node's own counts
            body["node"] = stats["node"]
            body["nodes"] = [{k: n[k] for k in ("node", "activeConnections",
                                                 "totalConnections", "sessions")}
                             for n in stats["nodes"]]
        # degraded still serves its own sessions: only draining takes it out of rotation
        return json_response(body, 503 if engine.shutting_down else 200)

    @bp.get("/stats")
    def stats() -> Response:
        """docs/PROTOCOL.md §10's figures (public); in a cluster each node's too, with its host and
        pid only for a caller with a valid Bearer token."""
        body = cluster_stats(view, engine.stats.snapshot(now_ms()))
        if "nodes" in body and not _bearer_is_valid():
            body["nodes"] = [{k: v for k, v in n.items() if k not in PRIVATE_NODE_FIELDS}
                             for n in body["nodes"]]
        return json_response(body)

    def _bearer_is_valid() -> bool:
        token = token_from_request(None, request.headers.get("Authorization"))
        if not token:
            return False
        try:
            engine.authenticate(token)
        except ProtoError:
            return False
        return True

    if config.metrics:
        @bp.get("/metrics")
        def metrics() -> Response:
            registry = ctx.metrics_registry
            if request.args.get("scope") != "node" and view is not None:
                registry = view.metrics_registry(registry)  # every node's, labelled
            return metrics_response(registry, request.headers.get("Accept"))

    if config.dashboard:
        add_dashboard_routes(bp, engine, config.dev_mode, at_root=ctx.own_app)
        # off unless operatorToken is set: the action routes are not there (404)
        add_operator_routes(bp, engine, config.operator_token, config.max_message_size)

    if config.debug_vitals:
        @bp.get("/debug/vitals")
        def debug_vitals() -> Response:
            return json_response(vitals_snapshot(engine))

    @bp.route("/proto/websocket", websocket=True)
    def websocket() -> Response:
        refused = request.environ.pop(REFUSED_KEY, None)
        if refused is not None:  # post_lane.py admitted it and was refused: answer that
            return error_response(refused)
        if not valid_host(request.environ.get("HTTP_HOST")):
            return error_response(InvalidMessage("a WebSocket upgrade needs one valid Host "
                                                 "header"))
        sock = raw_socket(request.environ)
        if sock is None:
            return _unsupported_server("WebSocket")
        try:
            admission = admit(ports, request, ws.WebSocketConnection.kind,
                              request.args.get("session") or None,
                              parse_seq_arg(request.args.get("last_seq"), "last_seq"))
        except ProtoError as exc:
            return error_response(exc)
        g.protoflask_live = True  # logged as open/closed, not as a request
        serve_apart(ports, admission, sock, request.environ, config.enable_compression)
        # a content type given: werkzeug otherwise looks for one in the empty headers,
        # raising and catching a KeyError (~3% of a handshake in a reconnect storm)
        return _TakenOverResponse(content_type="text/plain")

    if ctx.agui is not None and ctx.adapters is not None:
        add_agui_routes(bp, ctx.adapters, ctx.agui)

    @bp.post("/proto/ticket")
    def ticket() -> Response:
        """A single-use connect ticket for the Bearer token's user (``?ticket=`` on the
        transports instead of ``?token=``, which proxies would log). None while draining:
        it could only open a connection that would be refused."""
        if engine.shutting_down:
            return error_response(ShuttingDown())
        try:
            ticket, lifetime_ms = engine.issue_ticket(
                token_from_request(None, request.headers.get("Authorization")))
        except ProtoError as exc:
            return error_response(exc)
        response = json_response({"ticket": ticket, "expires_in_ms": lifetime_ms})
        response.headers["Cache-Control"] = "no-store"
        return response

    @bp.get("/proto/sse")
    def sse_stream() -> Response:
        refused = request.environ.pop(REFUSED_KEY, None)
        if refused is not None:  # post_lane.py tried to open it and was refused
            return error_response(refused)
        if raw_socket(request.environ) is None:
            return _unsupported_server("An SSE stream")
        return _live(sse.open_stream(ports, request))

    @bp.post("/proto/sse")
    def sse_post() -> Response:
        return sse.post_messages(ports, request)

    @bp.post("/proto/stream")
    def http_stream() -> Response:
        refused = request.environ.pop(REFUSED_KEY, None)
        if refused is not None:  # post_lane.py tried to open it and was refused
            return error_response(refused)
        if stream.opens_stream(request) and raw_socket(request.environ) is None:
            return _unsupported_server("An NDJSON stream")
        return _live(stream.handle_post(ports, request))

    add_mcp_routes(bp, ctx.mcp)  # /proto/mcp (docs/MCP.md)

    @bp.after_request
    def _finish(response: Response) -> Response:
        if config.enable_cors:
            _add_cors(response, origins)
        if config.enable_compression and not response.is_streamed:
            _maybe_gzip(response)
        if config.enable_logging and not g.get("protoflask_live") \
                and not g.get("protoflask_quiet"):
            elapsed = (time.perf_counter() - g.get("protoflask_started", time.perf_counter()))
            log_access(request.method, request.path, request.query_string,
                       response.status_code, elapsed)
        return response

    return bp


#: Where protoflask's own app's lane (post_lane.py) leaves the refusal of an upgrade it
#: tried to admit, for the route to answer as its own (Flask's hooks then add the rest).
REFUSED_KEY = "protoflask.refused"
#: The swap point of a socket handed over (the head lane's): the object the server
#: accepted, held open past its close (True), or its descriptor detached into a new one
KEEP_HANDED_SOCKET = True
#: What of the upgrade request's environ the WebSocket handshake reads.
_HANDSHAKE_KEYS = ("PATH_INFO", "QUERY_STRING")


def serve_apart(ports: Ports, admission: Any, sock: Any, environ: dict[str, Any],
                 compression: bool, handed_over: bool = False,
                 handshake: dict[str, Any] | None = None) -> None:
    """Serve an admitted WebSocket in a greenlet of its own, on a duplicate of the
    socket, and let the request end: the WSGI server's request, Flask's context and the
    request greenlet's deep stack are not held for the life of the connection (about a
    third of an idle session's memory: docs/PERFORMANCE.md). The WSGI server closes its
    own descriptor when the request ends; the connection lives on the duplicate. The
    greenlet starts once the request has ended, so the upgrade is answered only then.
    A TLS socket (gunicorn's certfile) cannot be duplicated: it is served in the request.
    A socket ``handed_over`` (the head lane's: no request of the server's is left on it)
    is not duplicated but detached (a dup and a close saved); its ``handshake`` is given."""
    if handshake is None:  # (the head lane's is made from its head: the same dict)
        handshake = {k: v for k, v in environ.items()
                     if k.startswith("HTTP_") or k in _HANDSHAKE_KEYS}
    if is_tls(sock):  # TLS served by gunicorn itself: dup() refuses it, so in the request
        ws.serve(ports, admission, sock, handshake, compression)
        return
    if handed_over and KEEP_HANDED_SOCKET and hold_open(sock):
        own = sock  # closed by the connection: the server's close only marks it
        gevent.spawn_raw(_serve_held, ports, admission, own, [handshake], compression)
        return
    if handed_over:
        timeout = sock.gettimeout()
        own = type(sock)(sock.family, sock.type, sock.proto, fileno=sock.detach())
        own.settimeout(timeout)
    else:
        own = sock.dup()
    # handed over in a box the greenlet empties: holding the dict itself would keep the
    # headers (~0.8 KB) as long as the connection lives
    box = [handshake]
    del handshake
    # A raw greenlet, not gevent's Greenlet: nothing joins or links the connection's
    # greenlet, and a Greenlet keeps its spawning stack (ten frame records) and tree for
    # its whole life: ~1 KB an idle session (docs/PERFORMANCE.md, p7-storm).
    gevent.spawn_raw(_serve_own, ports, admission, own, box, compression)


def _serve_own(ports: Ports, admission: Any, own: Any, box: list[dict[str, Any]],
               compression: bool) -> None:
    """The connection's greenlet (``serve_apart``): serve it on the duplicate ``own``."""
    try:
        ws.serve(ports, admission, own, box.pop(), compression)
    except Exception:  # what Flask logged as the request's 500 before
        log.exception("WebSocket connection failed")
    finally:
        own.close()


def _serve_held(ports: Ports, admission: Any, own: Any, box: list[dict[str, Any]],
                compression: bool) -> None:
    """``_serve_own`` on the socket object the server accepted, held open for it
    (``sockets.hold_open``) and let go once served."""
    try:
        _serve_own(ports, admission, own, box, compression)
    finally:
        let_go(own)


def _unsupported_server(what: str) -> Response:
    """A live transport on a WSGI server that does not hand over its socket (the Flask dev
    server, a thread pool): it could not keep the response streaming, so it is refused
    at once, before any session is made, instead of ending after its first bytes."""
    return json_response({"error": {
        "code": "UNSUPPORTED_SERVER",
        "message": f"{what} needs gunicorn's gevent worker or ProtoServer.start() "
                   "(`protoflask serve`), not this WSGI server"}}, 500)


def _live(response: Response) -> Response:
    """A streaming response is a live transport: its transport logs open and close."""
    if response.is_streamed:
        g.protoflask_live = True
    return response


def _add_cors(response: Response, origins: OriginPolicy) -> None:
    add_cors(response, request.headers.get("Origin"), origins)


def add_cors(response: Response, origin: str | None, origins: OriginPolicy) -> None:
    """The CORS headers of a request with this Origin, on ``response``."""
    headers = response.headers
    for name, value in cors_headers(origin, origins):
        if name == "Vary":
            headers.add(name, value)
        else:  # replaced, not repeated, when an error handler added them already
            headers[name] = value


def cors_headers(origin: str | None, origins: OriginPolicy) -> list[tuple[str, str]]:
    """The CORS headers of a response to a request with this Origin header (or none)."""
    if origins.restricted:
        if origin is None or not origins.allows(origin):
            return [VARY_ORIGIN]  # no CORS headers: the browser keeps the response from that page
        allowed = origin
    else:
        allowed = origin or "*"
    return [VARY_ORIGIN, ("Access-Control-Allow-Origin", allowed), *CORS_CONSTANT_HEADERS]


VARY_ORIGIN = ("Vary", "Origin")
CORS_CONSTANT_HEADERS = (
    ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
    ("Access-Control-Allow-Headers", "Authorization, Content-Type, Last-Event-ID, "
                                     "Mcp-Session-Id, MCP-Protocol-Version"),
    ("Access-Control-Expose-Headers", "Proto-Session, Mcp-Session-Id"),
    ("Access-Control-Max-Age", "600"),
)


def _maybe_gzip(response: Response) -> None:
    if response.mimetype != "application/json" or "Content-Encoding" in response.headers:
        return
    body = gzipped_json(response.get_data(), request.headers.get("Accept-Encoding"))
    if body is None:
        return
    response.set_data(body)
    response.headers["Content-Encoding"] = "gzip"
    response.headers.add("Vary", "Accept-Encoding")


def gzipped_json(body: bytes, accept_encoding: str | None) -> bytes | None:
    """A JSON body gzipped for a client that accepts gzip, when it is worth it; else None."""
    if "gzip" not in (accept_encoding or "").lower() or len(body) < GZIP_MIN_BYTES:
        return None
    return gzip.compress(body, compresslevel=5)


def log_access(method: str, path: str, query_string: bytes, status: int,
               elapsed: float) -> None:
    """The access line of one HTTP request (tokens redacted from the query)."""
    query = redacted_query(query_string.decode("latin-1"))
    access_log.info("%s %s%s %s %.1fms", method, path, f"?{query}" if query else "", status,
                    elapsed * 1000)


# -- HTTP errors of the app's own making (routing, werkzeug): JSON like every other ------

#: The contract's code for the HTTP errors werkzeug raises itself; any other status gets
#: its werkzeug name in upper snake case (415 UNSUPPORTED_MEDIA_TYPE, 500 INTERNAL_ERROR).
HTTP_ERROR_CODES = {400: "INVALID_MESSAGE", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
                    413: "MESSAGE_TOO_LARGE", 500: "INTERNAL_ERROR"}
#: Where protoflask's own routes live when it is mounted on an application's Flask app.
PROTO_PREFIX = "/proto/"
NO_UPGRADE_MESSAGE = (
    "this endpoint is a WebSocket: the request needs the headers 'Upgrade: websocket' and "
    "'Connection: Upgrade', and it arrived without them. If a proxy is in front of the "
    "server, it probably dropped them (nginx: proxy_http_version 1.1; proxy_set_header "
    "Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\")")


def install_error_handlers(app: App, ctx: WebContext) -> None:
    """Answer 400/404/405 (and any other werkzeug HTTPException) with the JSON error body.

    On protoflask's own app, every path. On an application's app, only protoflask's
    paths (its routes, and anything under /proto/); the application's own 404s and 405s
    stay the application's business and go to the handler it had (Flask's HTML page if
    none). A handler the application registers for a status code (``@app.errorhandler(404)``)
    comes before this one, as Flask looks up handlers by code first."""
    previous = app.error_handler_spec.get(None, {}).get(None, {}).get(HTTPException)
    own_paths: set[str] = set()
    origins = OriginPolicy(ctx.config.allowed_origins)

    def ours() -> bool:
        if ctx.own_app or request.path.startswith(PROTO_PREFIX):
            return True
        if not own_paths:
            own_paths.update(rule.rule for rule in app.url_map.iter_rules()
                             if rule.endpoint.startswith("protoflask."))
        return request.path in own_paths

    def handle(exc: HTTPException) -> Any:
        if not ours():
            return previous(exc) if previous is not None else exc
        response = http_error_response(exc)
        if ctx.config.enable_cors:  # the blueprint's own hook misses routing errors
            _add_cors(response, origins)
        return response

    app.register_error_handler(HTTPException, handle)


def http_error_response(exc: HTTPException) -> Response:
    """The JSON body for a werkzeug HTTPException; a WebSocket route reached without the
    upgrade headers is 426 Upgrade Required with a hint about proxies."""
    if isinstance(exc, WebsocketMismatch):
        if _asks_for_websocket():
            return json_response({"error": {
                "code": "INVALID_MESSAGE",
                "message": f"{request.path} is not a WebSocket endpoint"}}, 400)
        resp = json_response({"error": {"code": "UPGRADE_REQUIRED",
                                        "message": NO_UPGRADE_MESSAGE}}, 426)
        resp.headers["Upgrade"] = "websocket"  # (Connection is the WSGI server's header)
        return resp
    status = exc.code or 500
    if status == 405 and request.method == "GET" and _asks_for_websocket():
        # werkzeug reports a WebSocket upgrade to an HTTP-only route as a 405
        return json_response({"error": {
            "code": "INVALID_MESSAGE",
            "message": f"{request.path} is not a WebSocket endpoint"}}, 400)
    code = HTTP_ERROR_CODES.get(status) or re.sub(r"[^A-Z0-9]+", "_",
                                                  (exc.name or "error").upper()).strip("_")
    message = exc.description or exc.name or "error"
    if status == 404:
        message = f"no route {request.path}"
    elif status == 405:
        allowed = ", ".join(sorted(getattr(exc, "valid_methods", None) or []))
        message = f"{request.method} is not allowed on {request.path}" + \
            (f" (allowed: {allowed})" if allowed else "")
    resp = json_response({"error": {"code": code, "message": message}}, status)
    for name, value in exc.get_headers():
        if name.lower() not in ("content-type", "content-length"):
            resp.headers[name] = value  # Allow on a 405, Retry-After, WWW-Authenticate
    return resp


def _asks_for_websocket() -> bool:
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    connection = any(v.strip() == "upgrade"
                     for v in request.headers.get("Connection", "").lower().split(","))
    return upgrade and connection
