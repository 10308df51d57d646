"""What the adapters (``agui/``, ``mcp/``) are given of the session layer: ``Ports``, and
the verbs of ``port.AdapterPorts`` (docs/ARCHITECTURE.md, "The seams").

The adapters import nothing of the session layer but ``port`` (tests/test_layers.py):
the server builds this on its engine and hands it to them, typed as the port's protocol.
A session is handed out as an unattached ``SessionPort`` of the adapter's kind, with no
replay (``last_seq`` None) unless the adapter sets one before attaching it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .clock import now_ms
from .core.errors import ProtoError
from .live import FailCall, LiveSession, OpenCall, Operation, Send, ToolDone, ToolUpdate
from .port import Ports, SessionPort, SessionState

if TYPE_CHECKING:
    from .core.messages import Outbound
    from .engine import Engine
    from .tool_runner import Report


class AdapterGate(Ports):
    """``port.AdapterPorts`` on one engine (see the module doc)."""

    def __init__(self, engine: "Engine") -> None:
        super().__init__(engine)
        self.config = engine.config
        self.tools = engine.tools
        self.tool_context = engine.tool_context

    def _port(self, live: LiveSession, kind: str) -> SessionPort:
        return SessionPort(self._engine, live, None, kind, self.limits)

    # -- admission ---------------------------------------------------------------------

    def user(self, token: str | None, ticket: str | None = None) -> str:
        return self._engine.authenticate(token, ticket)

    def refused(self, exc: ProtoError) -> None:
        stats = self._engine.stats
        stats.count(stats.connections_refused, exc.code)

    def open_body(self, user_id: str) -> None:
        self._engine.open_body(user_id)

    def close_body(self, user_id: str) -> None:
        self._engine.close_body(user_id)

    def session(self, session_id: str, user_id: str, kind: str) -> SessionPort:
        return self._port(self._engine.find_session(session_id, user_id), kind)

    def held(self, session_id: str, user_id: str, kind: str) -> SessionPort | None:
        live = self._engine.held_session(session_id, user_id)
        return self._port(live, kind) if live is not None else None

    def here(self, session_id: str) -> SessionPort | None:
        live = self._engine.hub.get(session_id)
        return self._port(live, "") if live is not None else None

    def state_here(self, session_id: str) -> SessionState | None:
        live = self._engine.hub.get(session_id)
        return live.core if live is not None else None

    def create(self, user_id: str, kind: str, session_id: str | None = None, *,
               connect: bool = False) -> SessionPort:
        engine = self._engine
        if connect:
            engine.open_connection(kind, user_id)
        try:
            # a new session counts against the memory budget on every way in
            engine.budget.admit(user_id)
            live = engine.new_session(user_id, session_id)
        except BaseException:
            if connect:
                engine.close_connection(kind, user_id)
            raise
        return self._port(live, kind)

    def connect(self, port: SessionPort) -> None:
        self._engine.open_connection(port.kind, port.user_id,
                                     replacing=port.live.transport is not None)

    def disconnect(self, port: SessionPort) -> None:
        self._engine.close_connection(port.kind, port.user_id)

    # -- the session -------------------------------------------------------------------

    def state(self, port: SessionPort) -> SessionState:
        return port.live.core

    def is_current(self, port: SessionPort) -> bool:
        return self._engine.hub.get(port.id) is port.live

    def serving(self, port: SessionPort) -> SessionPort | None:
        transport = port.live.transport
        return transport if isinstance(transport, SessionPort) else None

    def start_run(self, port: SessionPort, run_id: str, thread_id: str | None,
                  metadata: dict[str, Any] | None) -> None:
        live = port.live
        live.core.work.start_run(now_ms(), run_id, thread_id, metadata)
        self._engine.settle(live)

    def note_state(self, port: SessionPort) -> None:
        link = port.live.link
        if link is not None:
            link.note_state(port.live)

    # -- sessions wherever they live ---------------------------------------------------

    def send(self, session_id: str, out: "Outbound") -> bool:
        try:
            return bool(self._engine.deliver(session_id, Send(out)))
        except ProtoError:  # SessionNotFound: expired meanwhile
            return False

    def _deliver(self, session_id: str, op: Operation) -> bool:
        try:
            return bool(self._engine.hub.deliver(session_id, op))
        except ProtoError:  # the session expired meanwhile
            return False

    def open_call(self, session_id: str, call_id: str, run_id: str | None) -> bool:
        return self._deliver(session_id, OpenCall(call_id, run_id))

    def report(self, session_id: str, report: "Report") -> bool:
        if report.kind == "update":
            return self._deliver(session_id, ToolUpdate(report.call_id, report.status))
        if report.kind == "done":
            return self._deliver(session_id,
                                 ToolDone(report.call_id, report.status, report.result))
        assert report.error is not None
        return self._deliver(session_id, FailCall(report.call_id, report.error))

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        return self._engine.hub.lookup(session_id)

    def forward(self, session_id: str, user_id: str, body: bytes) -> None:
        self._engine.post_body(session_id, user_id, body, None)

    @property
    def node_id(self) -> str | None:
        node = getattr(self._engine.hub, "node_id", None)
        return node if isinstance(node, str) else None

    @property
    def other_live_nodes(self) -> Callable[[], list[str]] | None:
        found: Callable[[], list[str]] | None = \
            getattr(self._engine.hub.view, "other_live_nodes", None)  # (cluster/view.py)
        return found
