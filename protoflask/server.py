"""ProtoServer: the public Python API (docs/PROTOCOL.md §12), start/stop, and the Flask
extension contract (``ProtoServer(app=None)`` + ``init_app``).

Threads: everything protocol-related runs in one gevent hub. Under gunicorn's gevent
worker that is the worker's hub. ``start()`` in a program that has not monkey-patched
runs the server in a background thread with its own hub; public methods called from
other threads are then handed to that hub and wait for the result, so a plain script
or test can call them safely.
"""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
import uuid
from functools import partial
from typing import Any, Callable, Iterable, Mapping

import gevent
from blinker import NamedSignal
from flask import Flask

from . import signals
from .auth import authority_from_config, weak_secret_warning
from .config import APP_CONFIG_PREFIX, ConfigError, ServerConfig
from .core import messages
from .core.coalesce import DEFAULT_MAX_CHARS, DEFAULT_MAX_DELAY_MS
from .core.errors import CloseCode, InvalidMessage, ProtoError, RunNotFound, SessionNotFound
from .core.handoff import snapshot
from .adapter_ports import AdapterGate
from .engine import Engine
from .clock import now_ms
from .cli.devtoken import forget_dev_token, save_dev_token
from .cluster import make_hub
from .hub import Hub, cluster_stats
from .live import LiveSession, Send, ToolDone, ToolUpdate
from .metrics import create_registry
from .serving import EmbeddedServer
from .tools import Tool, ToolRegistry, awaited_call, builtin_tools
from .streaming import StreamedText, stream_chunks
from .post_lane import SessionPostLane
from .mcp import McpEndpoint
from .web import WebContext, create_blueprint
from .agui.run import AguiRun, AguiServices
from .agui.services import agui_services, install_socket_agui

log = logging.getLogger("protoflask")


class ProtoServer:
    def __init__(self, config: ServerConfig | Mapping[str, Any] | None = None,
                 app: Flask | None = None, *, hub: Hub | None = None) -> None:
        self.tools = ToolRegistry()
        for tool in builtin_tools():
            self.tools.register(tool)
        self._hub_arg = hub
        self._config_arg = config
        self._configure(ServerConfig.load(config, app_config=app.config if app else None))
        #: /metrics serves this registry; an application may register its own collectors
        self.metrics_registry = create_registry(lambda: self.engine)
        self._app: Flask | None = None
        self._own_app = False  # the app was created here: the page may take "/"
        self._listeners: list[Callable[..., Any]] = []
        self._agui_handler: Callable[[AguiRun], Any] | None = None
        self._socket_agui = install_socket_agui(self, lambda: self.adapter_ports,
                                                self._agui_services)
        self._serving = EmbeddedServer()
        if app is not None:
            self.init_app(app)

    def _configure(self, loaded: ServerConfig) -> None:
        """Everything derived from the configuration (at construction, and again in
        ``init_app`` when the first app's config changes it)."""
        self._loaded_config = loaded
        self.config = loaded
        self.dev_token: str | None = None
        public_keys = bool(self.config.jwt_public_key or self.config.jwks_url)
        if not self.config.jwt_secret:
            if not self.config.dev_mode and not public_keys:
                raise ConfigError(
                    "jwtSecret is required: set JWT_SECRET (or pass jwtSecret, or set "
                    "PROTOFLASK_JWT_SECRET in app.config), or give your identity provider's "
                    "keys (JWKS_URL or JWT_PUBLIC_KEY), or run in development mode "
                    "(protoflask serve --dev, or PROTOFLASK_DEV=1) to get a random secret and "
                    "a ready token")
            if self.config.dev_mode:
                self.config = self.config.replace(jwt_secret=secrets.token_urlsafe(32))
        if not self.config.dev_mode and (weak := weak_secret_warning(self.config.jwt_secret)):
            log.warning("jwtSecret: %s", weak)
        self.authority = authority_from_config(self.config)
        if self.config.dev_mode:
            self.dev_token = self.authority.issue("dev")
        self.hub = self._hub_arg or make_hub(self.config)
        if self.config.metrics and self.hub.view is not None:
            self.hub.view.set_metrics_source(self._metrics_text)
        # the signals' own functions bound to this server: the engine calls down to
        # signals.py, never into the server
        self.engine = Engine(self.config, self.hub, self.tools, self.authority,
                             emit=partial(signals.emit, self),
                             emit_error=partial(signals.emit_error, self),
                             tool_context=self,
                             # clustered: a ticket store every worker redeems from
                             tickets=self.hub.tickets)
        #: what the adapters (agui/, mcp/) are given of the session layer
        self.adapter_ports = AdapterGate(self.engine)

    def _metrics_text(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.metrics_registry)

    # -- Flask integration -----------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Mount /health, /stats and /proto/* on an existing Flask app.

        The app's ``PROTOFLASK_*`` config keys count (explicit arguments > app.config >
        environment > defaults). The configuration belongs to the server's first app:
        ``init_app`` on a server that has no app yet re-derives it; a later app whose
        keys would change it is refused with ConfigError."""
        if "protoflask" in app.extensions:
            raise RuntimeError("this Flask app already has a ProtoServer")
        own_keys = any(isinstance(k, str) and k.startswith(APP_CONFIG_PREFIX) for k in app.config)
        loaded = ServerConfig.load(self._config_arg, app_config=app.config) if own_keys \
            else self._loaded_config
        if loaded != self._loaded_config:
            if self._app is not None:
                changed = ", ".join(self._loaded_config.differences(loaded))
                raise ConfigError(
                    f"app {app.name!r} would change {changed} of a ProtoServer already "
                    "configured by its first app; a server has one configuration")
            self._configure(loaded)
        app.extensions["protoflask"] = self
        ctx = WebContext(self.engine, self.config, self.metrics_registry, own_app=self._own_app,
                         mcp=McpEndpoint(self.adapter_ports, self.config.allowed_origins),
                         agui=self._agui_services, adapters=self.adapter_ports)
        app.register_blueprint(create_blueprint(ctx))
        if self._own_app:  # the session POSTs skip Flask's request cycle (post_lane.py)
            app.wsgi_app = SessionPostLane(app, ctx)  # type: ignore[method-assign]
        if self._app is None:
            self._app = app

    @property
    def app(self) -> Flask:
        """The Flask app serving this server (created on first use if none was given)."""
        if self._app is None:
            self._own_app = True
            # not "protoflask": the app logger must not be the logger the WSGI server
            # writes its errors to (Flask logs to wsgi.errors, which logs there: a loop)
            self.init_app(Flask(__name__))
        assert self._app is not None
        return self._app

    # -- lifecycle -------------------------------------------------------------------

    @property
    def clustered(self) -> bool:
        """Whether sessions are shared with other processes (a Redis-backed hub)."""
        return self.hub.clustered

    @property
    def port(self) -> int | None:
        """The port actually listened on (useful with port 0)."""
        return self._serving.port

    def start(self) -> None:
        """Listen on host:port and return once listening; emits ``started``."""
        self._serving.start(self.app, self.config.host, self.config.port,
                            listening=self.engine.ensure_running)
        self.engine.shutting_down = False
        self._warn_about_open_origins()
        if self.dev_token:
            log.warning("development mode: a random jwtSecret was generated (never use this "
                        "in production); server.dev_token holds a token for user 'dev'")
        self._emit(signals.started)

    def _warn_about_open_origins(self) -> None:
        if not self.config.allowed_origins and not self.config.dev_mode \
                and self.config.node_env == "production":
            log.warning("allowedOrigins is empty: browser pages of any origin may open "
                        "/proto/* connections with a token they hold; set ALLOWED_ORIGINS "
                        "to your app's origins (or '*' to allow any and silence this)")

    def serve_forever(self, grace: float = 7.0) -> None:
        """Serve until SIGINT or SIGTERM, then ``stop(grace)``: running tools get up to
        ``grace`` seconds (as under gunicorn's default graceful timeout) while new
        connections are refused. For scripts and examples (production runs gunicorn).
        Starts the server unless it already runs; call it from the main thread."""
        if not self._serving.running:
            self.start()
        saved = self._save_dev_token()
        done = threading.Event()  # gevent's own when the process is monkey-patched
        previous = {sig: signal.signal(sig, lambda *_: done.set())
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            done.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if saved:
                forget_dev_token(saved)
            self.stop(grace)

    def _save_dev_token(self) -> str | None:
        """In development mode, the token saved for the client commands as `serve --dev`
        saves it (`PROTOFLASK_DEV=1 python app.py`, then `protoflask chat`); or None."""
        if not self.dev_token:
            return None
        host = self.config.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return self.dev_token if save_dev_token(f"http://{host}:{self.port}",
                                                self.dev_token) else None

    def stop(self, grace: float = 0.0) -> None:
        """Close every connection (1001), cancel running tools, stop listening; emits
        ``stopped``. With ``grace`` (seconds), drain first: new connections are refused
        (503 SHUTTING_DOWN, /health 503 draining) while running tool calls get up to
        ``grace`` to finish."""
        if not self._serving.running:
            self.drain(grace)
            self.serving_stopped()
            return
        self.drain(grace)
        self._serving.stop(closing=self.engine.shutdown_sessions,
                           stopped=self.engine.stop_timers)
        self._emit(signals.stopped)

    def drain(self, grace: float) -> None:
        """Refuse new connections and wait up to ``grace`` seconds for running and queued
        tool calls to finish (their clients stay connected to receive the results)."""
        def wait() -> None:
            self.engine.shutting_down = True
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.engine.tools_busy():
                gevent.sleep(0.05)
        self._call(wait)

    def serving_started(self) -> None:
        """For hosting servers that are not ``start()`` (gunicorn_worker.GeventWorker)."""
        self.engine.ensure_running()
        self._warn_about_open_origins()
        self._emit(signals.started)

    def serving_stopped(self) -> None:
        """For hosting servers that are not ``start()`` (gunicorn's worker shutdown)."""
        self.engine.shutdown_sessions()
        self.engine.stop_timers()
        self._emit(signals.stopped)

    def close_all_connections(self) -> None:
        """Close every live transport (1001); sessions stay for resume."""
        self._call(self.engine.close_transports, CloseCode.GOING_AWAY, "closed by server")

    # -- threads -----------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in the server's hub and return its result (or raise its error)."""
        return self._serving.call(fn, *args)

    # -- tools -------------------------------------------------------------------------

    def register_tool(self, tool: Tool) -> None:
        self.tools.register(tool)

    def unregister_tool(self, name: str) -> bool:
        return self.tools.unregister(name)

    def get_tools(self) -> list[Tool]:
        return list(self.tools)

    # -- AG-UI (docs/AGUI.md) ---------------------------------------------------------

    def agui_handler(self, fn: Callable[[AguiRun], Any]) -> Callable[[AguiRun], Any]:
        """Decorator: ``fn(run)`` answers every AG-UI run (POST /proto/agui), in a
        greenlet of its own, with ``run.stream_text``, ``run.call_tool``,
        ``run.call_frontend_tool``, ``run.set_state``...; its return value is the run's
        result, an exception it raises ends the run with RUN_ERROR. Without one the
        built-in echo (echoMessages) answers the last user message."""
        self._agui_handler = fn
        return fn

    def _agui_services(self) -> AguiServices:
        return agui_services(
            self.adapter_ports, call=self._call, call_tool=self.call_tool,
            send_message=self.send_message, finish_run=self.finish_run, handler=self._agui_handler,
            report_error=lambda exc, session_id: self._emit_error(exc, session_id=session_id))

    def tool(self, name: str | None = None, *, description: str | None = None,
             input_schema: dict[str, Any] | None = None,
             output_schema: dict[str, Any] | None = None, timeout: float | None = None,
             inline: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register a function as a tool (its docstring is the description).

        ``inline=True`` runs it in the connection's greenlet: only for functions that
        never block (see ``Tool.inline``)."""
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register_tool(Tool.from_function(
                fn, name, description=description, input_schema=input_schema,
                output_schema=output_schema, timeout=timeout, inline=inline))
            return fn
        return decorate

    def call_tool(self, session_id: str, name: str, params: Mapping[str, Any] | None = None,
                  *, run_id: str | None = None, call_id: str | None = None) -> Any:
        """Run a registered tool for the application's own agent, in a session (and run).

        The client sees the call like one of its own: the tool's ``send_tool_update``
        progress, then exactly one TOOL_DONE (call_id ``agent-...`` unless given); a
        RUN_CANCEL of ``run_id`` or a client TOOL_CANCEL cancels it. Blocks the calling
        greenlet until the call ends and returns the tool's result. Raises ToolNotFound,
        InvalidMessage (params), RunNotFound or DuplicateCallId before anything is sent;
        the call's error (e.g. ToolExecutionError) when it failed; ToolCancelled when it
        was cancelled. (No ``toolCall`` event: that one is for the client's calls.)"""
        args = dict(params or {})
        call_id = call_id or f"agent-{uuid.uuid4().hex[:16]}"

        def run() -> Any:
            live = self._live(session_id)
            outcome, done = awaited_call(call_id)
            self.engine.call_tool(live, name, args, call_id, run_id, on_done=done)
            return outcome.get()
        return self._call(run)

    # -- sessions and messages ---------------------------------------------------------

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """The session fields (docs/PROTOCOL.md §12) with live values, or None."""
        def read() -> dict[str, Any] | None:
            live = self.hub.get(session_id)
            if live is None:
                return self.hub.lookup(session_id)  # held by another node, if clustered
            snap = snapshot(live.core)
            transport = live.transport
            for kind, key in (("websocket", "ws"), ("sse", "sseResponse"),
                              ("stream", "httpResponse")):
                if transport is not None and transport.kind == kind:
                    snap[key] = getattr(transport, "writer", None) or transport
            return snap
        return self._call(read)

    def get_stats(self) -> dict[str, Any]:
        """Statistics (docs/PROTOCOL.md §10); with Redis, for the whole cluster plus ``nodes``."""
        return self._call(
            lambda: cluster_stats(self.hub.view, self.engine.stats.snapshot(now_ms())))

    def send_message(self, session_id: str, message: Mapping[str, Any]) -> None:
        """Send a message (dict with type, channel, payload) to one session."""
        out = messages.from_dict(message)
        self._call(self.engine.deliver, session_id, Send(out))

    def send_audio(self, session_id: str, data: bytes, mime: str,
                   message_id: str | None = None, final: bool = False) -> str:
        """Send raw audio bytes as one AUDIO_CHUNK on AUDIO_OUT (base64 on the wire);
        returns the message_id: pass it again for the next chunks of the same stream,
        with ``final=True`` on the last."""
        message_id = message_id or uuid.uuid4().hex
        out = messages.audio_chunk(message_id, mime, data, final)
        self._call(self.engine.deliver, session_id, Send(out))
        return message_id

    def stream_text(self, session_id: str, chunks: Iterable[Any], run_id: str | None = None,
                    content_type: str = "text/plain", *, max_chars: int = DEFAULT_MAX_CHARS,
                    max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> StreamedText:
        """Stream a model's reply to a session as one text: MESSAGE_START, PARTs, END.

        ``chunks`` is any iterable of text (a model SDK's stream mapped by a generator
        expression). Small chunks are coalesced into parts: a part goes out when
        ``max_delay_ms`` passed since the last one or ``max_chars`` are waiting (see
        ``protoflask.core.coalesce``). The stream stops within one chunk when ``run_id``'s
        run ends (a client's RUN_CANCEL) or the session is gone; the text is always closed
        with MESSAGE_END while the session exists. Blocks the calling greenlet (or thread)
        until done and returns what was sent. Raises SessionNotFound / RunNotFound before
        anything is sent; the session must be held by this worker (like ``call_tool``)."""
        if max_chars < 1 or max_delay_ms < 0:
            raise ValueError("max_chars must be >= 1 and max_delay_ms >= 0")
        # no PART may exceed maxMessageSize: a character is at most 6 bytes of JSON
        max_chars = min(max_chars, max(1, (self.config.max_message_size - 1024) // 6))

        def open_text() -> tuple[LiveSession, Any]:
            live = self._live(session_id)
            run = None
            if run_id is not None:
                run = live.core.runs.get(run_id)
                if run is None:
                    raise RunNotFound(f"no active run {run_id!r} in session {session_id!r}")
            return live, run
        live, run = self._call(open_text)

        def stop_reason() -> str | None:
            if self.hub.get(session_id) is not live:
                return "session_gone"
            if run is not None and run.status != "active":
                return f"run_{run.status}"
            return None

        def send(out: messages.Outbound) -> bool:
            try:
                return bool(self._call(self.engine.deliver, session_id, Send(out)))
            except ProtoError:  # SessionNotFound: expired meanwhile
                return False

        return stream_chunks(chunks, uuid.uuid4().hex, content_type, send=send,
                             stop_reason=stop_reason, max_chars=max_chars,
                             max_delay_ms=max_delay_ms)

    def broadcast(self, message: Mapping[str, Any]) -> int:
        """Send a message to every connected session; returns how many it reached."""
        out = messages.from_dict(message)
        return self._call(self.engine.broadcast, out)

    def send_tool_update(self, session_id: str, call_id: str, status: str = "RUNNING",
                         progress: float | None = None, partial: Any = None) -> bool:
        return self._call(self.engine.deliver, session_id,
                          ToolUpdate(call_id, status, progress, partial))

    def send_tool_done(self, session_id: str, call_id: str, status: str,
                       result: Any = None) -> bool:
        """Finish a call (OK, ERROR or CANCELLED); False if it had already finished."""
        if status not in messages.TOOL_DONE_STATUSES:
            raise InvalidMessage(f"status must be one of {messages.TOOL_DONE_STATUSES}")
        return self._call(self.engine.deliver, session_id, ToolDone(call_id, status, result))

    def start_run(self, session_id: str, run_id: str | None = None,
                  thread_id: str | None = None, metadata: Any = None) -> dict[str, Any]:
        """Start a run for the application's agent; returns the run (docs/PROTOCOL.md §12)."""
        return self._run_op(session_id, lambda live, now: live.core.work.start_run(
            now, run_id=run_id, thread_id=thread_id, metadata=metadata))

    def finish_run(self, session_id: str, run_id: str, summary: Any = None,
                   error: Any = None) -> dict[str, Any]:
        return self._run_op(session_id, lambda live, now: live.core.work.finish_run(
            run_id, now, summary=summary, error=error))

    def cancel_run(self, session_id: str, run_id: str) -> dict[str, Any]:
        return self._run_op(session_id, lambda live, now: live.core.work.cancel_run(run_id, now))

    def _run_op(self, session_id: str, op: Callable[[LiveSession, int], Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            live = self._live(session_id)
            result = op(live, now_ms())
            self.engine.settle(live)
            return result.to_dict()
        return self._call(run)

    def _live(self, session_id: str) -> LiveSession:
        live = self.hub.get(session_id)
        if live is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return live

    def issue_token(self, user_id: str, expires_in: str | int | None = None) -> str:
        return self.authority.issue(user_id, expires_in)

    # -- events --------------------------------------------------------------------------

    def on(self, event: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Listen to a spec event by its name; ``fn`` gets the spec's positional args."""
        try:
            signal, arg_names = signals.BY_EVENT_NAME[event]
        except KeyError:
            raise ValueError(f"unknown event {event!r}; known: "
                             f"{', '.join(signals.BY_EVENT_NAME)}") from None

        def receiver(sender: Any, **kwargs: Any) -> None:
            fn(*(kwargs.get(name) for name in arg_names))

        self._listeners.append(receiver)  # blinker holds receivers weakly
        signal.connect(receiver, sender=self, weak=False)
        return fn

    def _emit(self, signal: NamedSignal, **kwargs: Any) -> None:
        """Send a signal from this server (``signals.emit``)."""
        signals.emit(self, signal, **kwargs)

    def _emit_error(self, exc: BaseException, **kwargs: Any) -> None:
        signals.emit_error(self, exc, **kwargs)


def create_app(config: ServerConfig | Mapping[str, Any] | None = None) -> Flask:
    """A Flask app with a ProtoServer configured from ``config`` and the environment."""
    return ProtoServer(config).app
