"""protoflask's own app answers the session POSTs without Flask's request cycle.

``POST /proto/sse?session=<id>`` and ``POST /proto/stream?session=<id>`` carry every
upstream message of the two HTTP transports, one request per batch; ``POST /proto/mcp``
every MCP request (docs/MCP.md), one per call. Flask's request
context, URL matching, hooks and response object cost about as much per request as the
protocol work of a dozen messages (docs/PERFORMANCE.md, "p5-http"). On protoflask's own
app (``create_app()``, a ``ProtoServer`` given no app) this WSGI middleware answers them
itself, with exactly what the blueprint's route and hooks answer: the same status,
headers (CORS, gzip) and JSON body, and the same access log line.

It steps aside, and the request goes through Flask, whenever the difference could be
seen or the request is not the common case: a hook, teardown function or URL processor
that is not protoflask's own, a receiver of Flask's request or app-context signals, a
``SERVER_NAME``, an ``Origin`` the allow-list refuses (Flask's hook answers the 403), a
query string that needs decoding, no ``session`` or a resume (``last_seq``). An upgrade
it admits is served as the route serves it; one the session layer refuses is handed to
Flask's route with the refusal (``web.REFUSED_KEY``), which answers it as its own. An
application's own Flask app (``ProtoServer(app)``, ``init_app``) never gets the lane:
middleware it wrapped around its app before protoflask was added would be skipped.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import orjson
from flask import signals as flask_signals
from werkzeug.exceptions import InternalServerError
from werkzeug.http import HTTP_STATUS_CODES

from .mcp import Answer
from .origins import OriginPolicy
from .pins import check_flask
from .port import Ports
from .auth import token_from_request
from .core.bodies import parse_seq_arg
from .core.errors import ProtoError
from .transports.http import PostAnswer, answer_post
from .transports.sockets import raw_socket
from .transports import sse, stream
from .transports.ws_handshake import asks_upgrade
from .web import (BLUEPRINT_NAME, REFUSED_KEY, ConnectionTakenOver, WebContext, add_cors,
                  cors_headers, gzipped_json, log_access, serve_apart, valid_host)

if TYPE_CHECKING:
    from flask import Flask

check_flask()  # app_is_plain reads Flask's hook tables: fail here if they moved

log = logging.getLogger("protoflask.web")

#: The paths whose POST with ``?session=`` is a session's upstream batch.
LANE_PATHS = frozenset({"/proto/sse", "/proto/stream"})
#: The WebSocket endpoint, whose upgrades the lane also admits
WEBSOCKET_PATH = "/proto/websocket"
#: The SSE endpoint, whose streams (GET) the lane also opens, as it opens the NDJSON
#: streams (a POST /proto/stream without ``session``, or a resume with ``last_seq``)
SSE_PATH = "/proto/sse"
STREAM_PATH = "/proto/stream"
#: The MCP endpoint, whose POSTs the lane also answers (its own Origin rule included)
MCP_PATH = "/proto/mcp"
#: Flask's signals sent during a request's cycle: a receiver would miss the lane's requests.
REQUEST_SIGNALS = (flask_signals.request_started, flask_signals.request_finished,
                   flask_signals.request_tearing_down, flask_signals.got_request_exception,
                   flask_signals.appcontext_pushed, flask_signals.appcontext_popped,
                   flask_signals.appcontext_tearing_down)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def plain_query(query: str) -> dict[str, str] | None:
    """The query's keys and values (the first of a repeated key, as Flask's
    ``request.args.get``), or None when it is not plain ASCII without escapes."""
    if not query.isascii() or "%" in query or "+" in query:
        return None
    args: dict[str, str] = {}
    for pair in query.split("&"):
        if pair:
            key, _, value = pair.partition("=")
            args.setdefault(key, value)
    return args


#: The swap point of the upgrade's Host check: ``web.valid_host``'s verdict remembered by
#: the header's exact value (64 kept), or with False worked out every time
#: (tests/web/test_app_is_plain.py holds the verdicts equal)
REMEMBER_HOSTS = True
_hosts: dict[str | None, bool] = {}


def host_ok(value: str | None) -> bool:
    """``web.valid_host(value)``, remembered (``REMEMBER_HOSTS``)."""
    known = _hosts.get(value) if REMEMBER_HOSTS else None
    if known is None:
        known = valid_host(value)
        if REMEMBER_HOSTS and len(_hosts) < 64:
            _hosts[value] = known
    return known


def status_line(status: int) -> str:
    return f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}"


class SessionPostLane:
    """WSGI middleware in front of protoflask's own Flask app (see the module doc)."""

    #: The swap point of an opened stream's response: the stream's own WSGI application
    #: (``HTTPDownstream.wsgi_app``: its headers as a list), or with True werkzeug's
    #: Response, as the route makes it (tests/transports/test_stream_app.py, and
    #: tests/integration/test_upgrade_lane.py against Flask's route on the wire).
    werkzeug_streams = False
    #: The swap point of ``app_is_plain``: the hook tables read by their shape when it is
    #: the common one, or with False every table walked (``app_is_plain_walk``);
    #: tests/web/test_app_is_plain.py holds the two verdicts equal
    plain_by_shape = True

    def __init__(self, app: "Flask", ctx: WebContext) -> None:
        self.app = app
        self.flask_wsgi_app: WSGIApp = app.wsgi_app
        self.engine = ctx.engine
        self.ports = Ports(ctx.engine)
        self.mcp = ctx.mcp
        self.config = ctx.config
        self.origins = OriginPolicy(ctx.config.allowed_origins)
        #: the refusal of an upgrade the worker's head lane tried (head_lane.py), by the
        #: client socket, for gunicorn's reading of the same request to answer
        self.refusals: dict[Any, ProtoError] = {}
        # protoflask's own hooks, as registered: anything beyond them sends requests to Flask
        self._own_hooks = {name: len(funcs.get(BLUEPRINT_NAME, ()))
                           for name, funcs in self._hook_tables().items()}
        self._own_counts = tuple(self._own_hooks[name]
                                 for name in ("before", "after", "teardown", "url_value"))

    def _hook_tables(self) -> dict[str, dict[Any, list[Any]]]:
        app = self.app
        return {"before": app.before_request_funcs, "after": app.after_request_funcs,
                "teardown": app.teardown_request_funcs,
                "url_value": app.url_value_preprocessors}

    def app_is_plain(self) -> bool:
        """Whether Flask's cycle would run nothing but protoflask's own hooks: each hook
        table read as a whole when it holds only protoflask's list or nothing (``len``
        and one lookup), a signal's receivers looked for only when it has any (what
        blinker's ``has_receivers_for`` tests first); any other shape walked
        (``app_is_plain_walk``). Nothing is remembered from one call to the next."""
        if not self.plain_by_shape:
            return self.app_is_plain_walk()
        app = self.app
        if app.teardown_appcontext_funcs or app.config.get("SERVER_NAME"):
            return False
        before, after, teardown, url_value = self._own_counts
        for table, expected in ((app.before_request_funcs, before),
                                (app.after_request_funcs, after),
                                (app.teardown_request_funcs, teardown),
                                (app.url_value_preprocessors, url_value)):
            if not table:
                continue  # (the walk finds nothing to refuse in it either)
            if len(table) != 1 or BLUEPRINT_NAME not in table:
                return self.app_is_plain_walk()  # another owner, perhaps with an empty list
            if len(table[BLUEPRINT_NAME]) != expected:
                return False
        for signal in REQUEST_SIGNALS:
            if signal.receivers and signal.has_receivers_for(app):
                return False
        return True

    def app_is_plain_walk(self) -> bool:
        """``app_is_plain`` by walking every hook table and asking every signal."""
        app = self.app
        if app.teardown_appcontext_funcs or app.config.get("SERVER_NAME"):
            return False
        for name, table in self._hook_tables().items():
            for owner, funcs in table.items():
                expected = self._own_hooks[name] if owner == BLUEPRINT_NAME else 0
                if len(funcs) != expected:
                    return False
        return not any(signal.has_receivers_for(app) for signal in REQUEST_SIGNALS)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == WEBSOCKET_PATH and environ.get("REQUEST_METHOD") == "GET":
            self.upgrade(environ)  # raises ConnectionTakenOver once it serves it
            return self.flask_wsgi_app(environ, start_response)
        if environ.get("PATH_INFO") == SSE_PATH and environ.get("REQUEST_METHOD") == "GET":
            opened = self.open(environ, "sse")
            if opened is not None:
                return opened(environ, start_response)
            return self.flask_wsgi_app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") not in LANE_PATHS:
            if environ.get("PATH_INFO") == MCP_PATH and environ.get("REQUEST_METHOD") == "POST" \
                    and self.app_is_plain():
                return self._mcp(environ, start_response)
            return self.flask_wsgi_app(environ, start_response)
        args = plain_query(environ.get("QUERY_STRING", ""))
        origin = environ.get("HTTP_ORIGIN")
        if args is not None and environ["PATH_INFO"] == STREAM_PATH \
                and (not args.get("session") or args.get("last_seq")):
            opened = self.open(environ, "stream")  # a stream opened (new or resumed)
            if opened is not None:
                return opened(environ, start_response)
            return self.flask_wsgi_app(environ, start_response)
        if args is None or not args.get("session") or args.get("last_seq") \
                or not self.origins.allows(origin) or not self.app_is_plain():
            return self.flask_wsgi_app(environ, start_response)
        started = time.perf_counter()
        try:
            answer = answer_post(self.ports, args, environ.get("HTTP_AUTHORIZATION"), environ)
        except Exception:  # what Flask logs and answers 500 for
            log.exception("Exception on %s [POST]", environ.get("PATH_INFO"))
            answer = PostAnswer(500, {"error": {"code": "INTERNAL_ERROR",
                                                "message": InternalServerError.description}})
        body = answer.encoded()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if answer.close:
            headers.append(("Connection", "close"))
        if answer.retry_after is not None:
            headers.append(("Retry-After", str(answer.retry_after)))
        config = self.config
        if config.enable_cors:
            headers += cors_headers(origin, self.origins)
        if config.enable_compression:
            compressed = gzipped_json(body, environ.get("HTTP_ACCEPT_ENCODING"))
            if compressed is not None:
                body = compressed
                headers[1] = ("Content-Length", str(len(body)))
                headers += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
        start_response(status_line(answer.status), headers)
        if config.enable_logging:
            log_access("POST", environ["PATH_INFO"], environ["QUERY_STRING"].encode("latin-1"),
                       answer.status, time.perf_counter() - started)
        return [body]

    def upgrade(self, environ: dict[str, Any], taking: Callable[[], Any] | None = None,
                handshake: dict[str, Any] | None = None) -> bool:
        """GET /proto/websocket as the route answers it: admitted and served apart (then
        ConnectionTakenOver, as the route's response raises), or refused (the refusal
        left for the route); returns at once, leaving it to Flask, for anything else.
        An upgrade the head lane already tried on this socket is not admitted twice:
        its refusal is the answer. The head lane (``taking``: it takes its request off the
        socket once admitted) hands the socket itself over: no server closes it after,
        and is told by True (no exception raised and caught per handshake); it may give the
        handshake's part of the environ made already (``head_lane.handshake_of``)."""
        if self.refusals and self._refused(environ):
            return False
        args = plain_query(environ.get("QUERY_STRING", ""))
        sock = raw_socket(environ)
        if args is None or sock is None or not host_ok(environ.get("HTTP_HOST")) \
                or environ.get("HTTP_UPGRADE", "").lower() != "websocket" \
                or not asks_upgrade(environ.get("HTTP_CONNECTION", "")) \
                or not self.origins.allows(environ.get("HTTP_ORIGIN")) \
                or not self.app_is_plain():
            return False
        try:
            admission = self.ports.admit(
                token_from_request(args.get("token"), environ.get("HTTP_AUTHORIZATION")),
                args.get("session") or None, parse_seq_arg(args.get("last_seq"), "last_seq"),
                "websocket", ticket=args.get("ticket"))
        except ProtoError as exc:
            environ[REFUSED_KEY] = exc
            return False
        if taking is not None:
            taking()  # the head lane takes the request's bytes off: the socket is the WebSocket's
        serve_apart(self.ports, admission, sock, environ, self.config.enable_compression,
                    handed_over=taking is not None, handshake=handshake)
        if taking is not None:
            return True
        raise ConnectionTakenOver()

    def open(self, environ: dict[str, Any], kind: str,
             args: dict[str, str] | None = None) -> Any:
        """GET /proto/sse, or a POST /proto/stream that opens a stream, as the route and
        its hooks answer it: the stream's response (with the CORS headers), or None for
        Flask (a refusal left for the route). A stream the head lane already tried to open
        on this socket is not admitted twice: its refusal is the answer. ``args``: the
        query's ``plain_query``, when the caller (the head lane) read it already."""
        if self.refusals and self._refused(environ):
            return None
        if args is None:
            args = plain_query(environ.get("QUERY_STRING", ""))
        origin = environ.get("HTTP_ORIGIN")
        if args is None or raw_socket(environ) is None or not self.origins.allows(origin) \
                or not self.app_is_plain():
            return None
        authorization = environ.get("HTTP_AUTHORIZATION")
        try:
            downstream = sse.open_downstream(
                self.ports, args, authorization, environ.get("HTTP_LAST_EVENT_ID", ""),
                environ) if kind == "sse" else stream.open_downstream(
                self.ports, args, authorization, environ)
        except ProtoError as exc:
            environ[REFUSED_KEY] = exc
            return None
        if self.werkzeug_streams:
            response = downstream.response()
            if self.config.enable_cors:
                add_cors(response, origin, self.origins)
            return response
        return downstream.wsgi_app(cors_headers(origin, self.origins)
                                   if self.config.enable_cors else [])

    def _refused(self, environ: dict[str, Any]) -> bool:
        """Whether the head lane left a refusal for this request's socket (then in the
        environ, for the route)."""
        refused = self.refusals.pop(raw_socket(environ), None)
        if refused is None:
            return False
        environ[REFUSED_KEY] = refused
        return True

    def _mcp(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """POST /proto/mcp: the endpoint's Answer, with the headers Flask's cycle adds."""
        started = time.perf_counter()
        try:
            answer = self.mcp.post(environ)
        except Exception:  # what Flask logs and answers 500 for
            log.exception("Exception on %s [POST]", MCP_PATH)
            answer = Answer(500, orjson.dumps({"error": {
                "code": "INTERNAL_ERROR", "message": InternalServerError.description}}))
        body = answer.body
        headers: list[tuple[str, str]] = []
        if answer.mimetype is not None:
            headers.append(("Content-Type", answer.mimetype if answer.mimetype
                            == "application/json" else f"{answer.mimetype}; charset=utf-8"))
        config = self.config
        if isinstance(body, bytes):
            if config.enable_compression and answer.mimetype == "application/json":
                compressed = gzipped_json(body, environ.get("HTTP_ACCEPT_ENCODING"))
                if compressed is not None:
                    body = compressed
                    headers += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
            headers.append(("Content-Length", str(len(body))))
        headers += list((answer.headers or {}).items())
        if config.enable_cors:
            headers += cors_headers(environ.get("HTTP_ORIGIN"), self.origins)
        start_response(status_line(answer.status), headers)
        if config.enable_logging:
            log_access("POST", MCP_PATH, environ.get("QUERY_STRING", "").encode("latin-1"),
                       answer.status, time.perf_counter() - started)
        return [body] if isinstance(body, bytes) else body
