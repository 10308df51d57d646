"""The session port: the one object a transport holds, and the gate that gives one out.

A transport (``transports/``: WebSocket, SSE, the NDJSON stream) only frames bytes. What
it asks of the session layer goes through a handful of verbs on its ``SessionPort``:

- upstream: ``receive`` (one message's bytes), ``receive_binary``, ``too_large`` (a
  message too large to take whole); the POST body goes through ``Ports.answer_post``;
- downstream: ``take`` (what is ready to write now; the port wakes its writer when
  more is), ``take_final`` (everything, for a closing transport), ``in_flight`` and
  ``written`` (what the transport is writing, for back-pressure);
- its life: ``attach`` (it serves the session from now on) and ``end``.

After each upstream call the session layer drains the events the call caused
(``Engine.receive``: the core's events, to the dispatcher): no lower layer calls up into
it. The port is the session's ``Transport`` as the registry sees it: its ``bell``
(``live.Bell``) is the writer's, which the session rings when it has messages (the event
loop runs the writer's answer; a WebSocket's reader pulls after each read anyway), and
``close`` is forwarded to the writer.

Every transport writes the same way, on one node and on Redis: ``take`` hands what the
core stamped to the cluster's write-behind stage first (``LiveSession.take_writable_then``:
the journal), returns nothing meanwhile, and the stage (``live.Stage``) rings the writer's
bell once it has it; the next ``take`` returns that batch. While a batch is in the stage
the transport writes nothing else (``holding``), so a close frame or a later batch never
overtakes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol

import gevent.event
import orjson

from .clock import now_ms, now_ns
from .core.errors import (
    CloseCode, InvalidMessage, MessageTooLarge, ProtoError, RequestTimeout,
)
from .bell import SILENT, Bell, apart
from .live import NO_STAGE, HANDING, HELD, IDLE, LiveSession, Stage

if TYPE_CHECKING:
    from .config import ServerConfig
    from .core.calls import Call, Run
    from .core.messages import Outbound
    from .core.replay import ReplayWindow
    from .core.settings import SessionSettings
    from .tool_runner import Report
    from .tools import ToolContext, ToolRegistry
    from .engine import Engine
    from .turns import Pacer

Ready = list[tuple[int, bytes]]

#: s a closing transport waits for a batch in the stage (the journal gives up on Redis
#: after its WAIT_LIMIT, 2 s, and releases it either way)
SETTLE_WAIT = 5.0


class Writer(Protocol):
    """What a transport offers its port."""

    kind: str  # "websocket" | "sse" | "stream"
    #: the greenlet that pulls what is ready after each of its calls (a WebSocket's
    #: reader), or None: a ring from it is dropped
    reader: Any

    def wake(self) -> None:
        """The session has messages to write: write them soon. Run by the event loop
        (the port's ``Bell``), never on a sender's stack: it must not block."""

    def close(self, code: int, reason: str) -> None:
        """Write what is pending, then close with ``code`` (WebSocket) or end the stream."""


@dataclass(frozen=True)
class Admission:
    """A connection request that passed auth, the owner check and the connection limit.

    ``resume`` is the user's existing session when the request named one."""

    user_id: str
    resume: LiveSession | None
    last_seq: int | None


@dataclass(frozen=True)
class Limits:
    """The configuration a transport frames by."""

    max_message_size: int
    body_timeout: int | None  # s
    heartbeat_interval: int  # ms

    @classmethod
    def of(cls, config: "ServerConfig") -> "Limits":
        return cls(config.max_message_size, config.body_timeout, config.heartbeat_interval)


class PostAnswer(NamedTuple):
    """What a session POST is answered with, before any web framework shapes it."""

    status: int
    body: dict[str, Any]
    #: the rest of the body is not worth waiting for: the connection is closed after it
    close: bool = False
    #: seconds for a Retry-After header (a 503 the client should retry)
    retry_after: int | None = None

    def encoded(self) -> bytes:
        return orjson.dumps(self.body)


class SessionPort:
    """One transport's hold on one session (see the module doc)."""

    __slots__ = ("engine", "live", "kind", "last_seq", "limits", "bell", "translate",
                 "_writer", "stage")

    def __init__(self, engine: "Engine", live: LiveSession, last_seq: int | None,
                 kind: str, limits: Limits | None = None) -> None:
        self.engine = engine
        self.live = live
        self.kind = kind
        self.last_seq = last_seq
        self.limits = limits if limits is not None else Limits.of(engine.config)
        #: rung when the session has messages to write (Transport): the writer's once
        #: attached (every message the session sends rings it)
        self.bell: Bell = SILENT
        #: rewrites every batch the session sends before the transport frames it (the
        #: AG-UI WebSocket extension's translator, agui/socket.py); by default ``list``,
        #: the batch as it is (a C call: a Python function would cost every write more)
        self.translate: Callable[[Ready], Ready] = list
        self._writer: Writer | None = None
        #: the write-behind stage (on Redis, the journal; made at its first batch)
        self.stage = NO_STAGE

    @property
    def id(self) -> str:
        return self.live.core.id

    @property
    def user_id(self) -> str:
        return self.live.core.user_id

    @property
    def upstream_seq(self) -> int:
        """The highest upstream seq the session has taken: a message the transport makes
        itself on its client's behalf (an AG-UI stream's PONG) takes the next one."""
        return self.live.core.upstream_seq

    @property
    def open_calls(self) -> "Mapping[str, Call]":
        """The session's open tool calls by call_id (read-only): an adapter asks whether
        the call it sent was accepted, and which of its calls still run (MCP's tasks)."""
        return self.live.core.calls

    @property
    def replay_window(self) -> "ReplayWindow":
        """The session's replay window (read-only): what an adapter finds there of its own
        ended calls (MCP's tasks read their TOOL_DONEs)."""
        return self.live.core.replay

    @property
    def pacer(self) -> "Pacer":
        """The worker's pacing of costly turns (turns.Pacer): a reader waits out what its
        user owes before a read and reports each costly turn."""
        return self.engine.pacer

    # -- its life --------------------------------------------------------------------------

    def attach(self, writer: Writer) -> None:
        """The transport serves the session from now on (an older one is closed, 4002)."""
        self._writer = writer
        # the session rings when its core has messages; the stage, when it has a batch
        # (``ring_anyway``): one bell, of functions of the port (no bound method kept)
        self.bell = Bell(_wake, writer.reader, wanted=_core_writable, subject=self)
        self.engine.open_transport(self.live, self, self.last_seq)

    def end(self) -> None:
        """The transport is done, however it ended: detach (if it attached) and give its
        connection slot back. Once."""
        self.engine.end_transport(self.live, self, attached=self._writer is not None)

    @property
    def writer(self) -> "Writer | None":
        """The transport connection this port writes through (None before ``attach``):
        what ``ProtoServer.get_session`` hands out as ``ws``/``sseResponse``/``httpResponse``."""
        return self._writer

    @property
    def attached(self) -> bool:
        """Whether this transport still serves the session (not superseded, not closed)."""
        return self.live.transport is self

    # -- Transport: what the registry and the session layer call ---------------------------

    def close(self, code: int, reason: str) -> None:
        writer = self._writer
        if writer is None:
            return
        if self.live.transport is self:  # it writes what is pending first, now
            writer.close(code, reason)
        else:  # superseded: nothing more to write; no frame of the port under its close,
            # and the resume is not held by the old socket's write (bell.apart)
            apart(writer.close, code, reason)

    # -- upstream --------------------------------------------------------------------------

    def receive(self, data: bytes | str) -> None:  # one upstream message
        self.engine.receive(self.live, data)

    def receive_binary(self, data: bytes) -> None:
        self.engine.receive_binary(self.live, data)

    def too_large(self, exc: MessageTooLarge, *, close: bool = False) -> None:
        """An upstream message too large for the transport to take whole (a WebSocket
        message, an NDJSON line, a POST body): the core's MESSAGE_TOO_LARGE, reported
        in-protocol; with ``close``, the transport is then closed with 1009 as the core
        closes one for an oversized message it read itself."""
        self.engine.reject(self.live, exc)
        if close:
            self.engine.close_transport(self.live, CloseCode.TOO_LARGE, "message too large")

    # -- downstream ------------------------------------------------------------------------

    def written(self) -> None:
        """The transport wrote what it took without waiting (never in flight)."""
        outbound = self.live.core.outbound
        if outbound.paused_by_server:  # OutboundQueue.written's own test, saving a call
            outbound.written()

    def has_writable(self) -> bool:
        return self.stage.released is not None or self.live.core.outbound.has_writable()

    @property
    def holding(self) -> bool:
        """A batch is in the write-behind stage: write nothing until it comes back."""
        return self.stage.state == HELD

    def take(self, fresh: bool = True) -> Ready:
        """What is ready to write now: a batch the stage released, else (with ``fresh``,
        while attached) what the core has, handed to the stage first when clustered.
        Empty while the stage holds a batch: the writer is woken once it is released."""
        stage = self.stage
        shared = stage.released
        if shared is not None:
            stage.released = None
            return self.translate(shared)
        live = self.live
        outbound = live.core.outbound
        if stage.state or not fresh or live.transport is not self \
                or not outbound.has_writable():
            return []
        now = now_ns() // 1_000_000  # now_ms(), inline: once per write
        if live.link is None:  # one process: no stage
            return self.translate(outbound.take_writable(now))
        if stage is NO_STAGE:  # (it rings ``bell`` itself)
            stage = self.stage = Stage(self.bell)
        stage.state = HANDING
        taken = live.take_writable_then(now, stage)
        if taken is not None:  # not journaled: written now
            stage.state = IDLE
            return self.translate(taken)
        if stage.state == HANDING:  # the stage has it; it rings the writer's bell
            stage.state = HELD
            return []
        shared, stage.released = stage.released, None  # released at once (a paused journal)
        if not shared:
            return []
        return self.translate(shared)

    def take_final(self) -> Ready:
        """Everything left for this transport, waiting for the stage if it must: what a
        closing transport writes before its close frame or last line."""
        link = self.live.link
        stage = self.stage
        if stage.state == HELD and link is not None and not link.moved:
            # (a session that moved: its batch is not this node's to write, and the
            # journal may be the caller, dropping it: no wait)
            settled = stage.settled = gevent.event.Event()
            settled.wait(SETTLE_WAIT)
            stage.settled = None
        out = self.take(fresh=False)
        live = self.live
        if live.transport is self:
            more = self.translate(live.take_writable(now_ms()))
            out = out + more if out else more
        return out

    def take_waiting(self) -> Ready:
        """What is ready to write, while attached, waiting (on Redis) until the cluster has
        it: for a writer that reads right after its own upstream call and cannot be rung
        for it later (the MCP link: a request routes its inline tool's answer at once).
        Not mixed with ``take``: such a writer never uses the stage."""
        live = self.live
        if live.transport is not self:
            return []
        return self.translate(live.take_writable(now_ms()))

    def in_flight(self, nbytes: int) -> None:
        """The transport is writing ``nbytes`` (0 once written): back-pressure reads it."""
        self.live.core.set_in_flight(nbytes)


def _wake(port: SessionPort) -> None:  # a port's bell's answer (``attach`` set a writer)
    port._writer.wake()  # type: ignore[union-attr]


def _core_writable(port: SessionPort) -> bool:  # what the bell asks (a release does not)
    return port.live.core.outbound.has_writable()


class Ports:
    """What the transports may ask of the session layer before they hold a port:
    admission, a port for an admitted request, and the session POST's answer."""

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self.limits = Limits.of(engine.config)

    def admit(self, token: str | None, session_id: str | None, last_seq: int | None,
              kind: str, ticket: str | None = None) -> Admission:
        """Let a live transport in, or raise the contract's error (401, 404, 503). Counts
        the connection: the caller owes the port's ``end`` (or ``abandon``)."""
        engine = self._engine
        try:
            user_id = engine.authenticate(token, ticket)
            resume = engine.find_session(session_id, user_id, last_seq=last_seq) \
                if session_id else None
            if resume is None:
                engine.budget.admit(user_id)
            engine.open_connection(kind, user_id, replacing=resume is not None
                                   and resume.transport is not None)
        except ProtoError as exc:
            engine.stats.count(engine.stats.connections_refused, exc.code)
            raise
        return Admission(user_id, resume, last_seq)

    def port(self, admission: Admission, kind: str) -> SessionPort:
        """The port of an admitted transport: a new session (nothing to replay), or the
        resumed one from ``last_seq`` (default: its ACK)."""
        if admission.resume is None:
            live = self._engine.new_session(admission.user_id)
            return SessionPort(self._engine, live, None, kind, self.limits)
        live, last_seq = admission.resume, admission.last_seq
        return SessionPort(self._engine, live,
                           live.core.last_ack if last_seq is None else last_seq, kind,
                           self.limits)

    def abandon(self, admission: Admission, kind: str) -> None:
        """An admitted transport that never got as far as its port: its slot back."""
        self._engine.close_connection(kind, admission.user_id)

    def open_post(self, args: Mapping[str, str], token: str | None) -> "PostAdmission | PostAnswer":
        """POST /proto/sse?session=<id> and the stream's follow-up POST, before its body is
        read: the request's admission (auth, the session, the user's count of bodies being
        read), or the contract's answer refusing it. The transport then reads the body
        (at most ``limits.max_message_size``, within ``limits.body_timeout``) and hands it,
        or the error reading it raised, to ``answer_post``; ``abandon_post`` if neither."""
        engine = self._engine
        try:
            user_id = engine.authenticate(token, args.get("ticket"))
            session_id = args.get("session")
            if not session_id:
                raise InvalidMessage("the session query parameter is required")
            live = engine.held_session(session_id, user_id)
            engine.open_body(user_id)  # bodies being read count per user
        except ProtoError as exc:
            return self._refused(exc)
        return PostAdmission(user_id, session_id, live)

    def answer_post(self, admission: "PostAdmission", body: bytes | ProtoError) -> PostAnswer:
        """The one place a session POST is answered: 202 {"accepted": n}, or the
        contract's error. ``body`` is what the transport read (or the error it raised).
        The body's messages are handed to the session one by one; their protocol errors
        go downstream. A body over maxMessageSize is 413 and one that is not JSON at all
        is 400; both are also reported downstream as the ERROR a WebSocket frame would
        get."""
        engine = self._engine
        engine.close_body(admission.user_id)
        live = admission.live
        try:
            if isinstance(body, ProtoError):
                raise body
            accepted = engine.post_body(admission.session_id, admission.user_id, body, live)
        except MessageTooLarge as exc:
            if live is not None:
                engine.reject(live, exc)
            return PostAnswer(exc.http_status, exc.to_http_body())
        except ProtoError as exc:
            return self._refused(exc)
        return PostAnswer(202, {"accepted": accepted})

    def abandon_post(self, admission: "PostAdmission") -> None:
        """An admitted POST whose body was never read: its count back."""
        self._engine.close_body(admission.user_id)

    @staticmethod
    def _refused(exc: ProtoError) -> PostAnswer:
        if isinstance(exc, RequestTimeout):  # the rest of the body is not worth waiting for
            return PostAnswer(exc.http_status, exc.to_http_body(), close=True)
        return PostAnswer(exc.http_status, exc.to_http_body(),
                          retry_after=getattr(exc, "retry_after", None))


@dataclass(frozen=True)
class PostAdmission:
    """A session POST let in (``Ports.open_post``): whose, for which session, and the
    session if this process held it before the body was read."""

    user_id: str
    session_id: str
    live: LiveSession | None


class SessionState(Protocol):
    """What an adapter reads of a session's protocol state (``AdapterPorts.state``;
    read-only): its runs, seqs, replay window and the extensions its client asked for."""

    @property
    def id(self) -> str: ...
    @property
    def runs(self) -> "Mapping[str, Run]": ...
    @property
    def downstream_seq(self) -> int: ...
    @property
    def last_ack(self) -> int: ...
    @property
    def replay(self) -> "ReplayWindow": ...
    @property
    def extensions(self) -> frozenset[str]: ...
    @property
    def settings(self) -> "SessionSettings": ...


class AdapterPorts(Protocol):
    """What the adapters (``agui/``, ``mcp/``) may ask of the session layer besides a
    transport's ``Ports``: they act for their clients on the native side. A session is
    handed out as an unattached ``SessionPort`` of the adapter's kind (``last_seq`` None:
    nothing replayed): ``connect`` counts it as a live transport, ``attach`` serves it and
    ``end`` gives the count back; or it is only read and sent to. ``adapter_ports.py``
    builds it on the engine; the server hands it to the adapters."""

    limits: Limits
    config: "ServerConfig"
    tools: "ToolRegistry"
    tool_context: "ToolContext | None"  # the fourth argument of a tool's execute

    def user(self, token: str | None, ticket: str | None = None) -> str:
        """The user of a token, or of a connect ticket (redeemed), or the contract's 401."""
    def refused(self, exc: ProtoError) -> None:
        """Count a connection refused with ``exc`` (as ``Ports.admit`` counts its own)."""
    def open_body(self, user_id: str) -> None:
        """Count a request body being read against the user's cap (``close_body`` after)."""
    def close_body(self, user_id: str) -> None: ...
    def session(self, session_id: str, user_id: str, kind: str) -> SessionPort:
        """The user's session, taken over from another node if need be; SESSION_NOT_FOUND."""
    def held(self, session_id: str, user_id: str, kind: str) -> SessionPort | None:
        """The user's session if this process holds it (SESSION_NOT_FOUND: another's)."""
    def here(self, session_id: str) -> SessionPort | None:
        """The session if this process holds it, whoever's (a signal's receiver)."""
    def state_here(self, session_id: str) -> SessionState | None:
        """``state(here(session_id))`` without making the port (a receiver's first look)."""
    def create(self, user_id: str, kind: str, session_id: str | None = None, *,
               connect: bool = False) -> SessionPort:
        """A new session (named ``session_id``, else random) if the memory budget lets it
        in; with ``connect``, counted as a live transport first (``connect``)."""
    def connect(self, port: SessionPort) -> None:
        """Count ``port`` as a live transport of its session (the limits' 503s); the caller
        owes its ``end`` (or ``disconnect``)."""
    def disconnect(self, port: SessionPort) -> None:
        """A connected port that never attached: its count back."""
    def state(self, port: SessionPort) -> SessionState: ...
    def is_current(self, port: SessionPort) -> bool:
        """Whether this process still holds the session ``port`` was made for."""
    def serving(self, port: SessionPort) -> SessionPort | None:
        """The port of the transport serving the session now, if any."""
    def start_run(self, port: SessionPort, run_id: str, thread_id: str | None,
                  metadata: dict[str, Any] | None) -> None:
        """Start a run in the session on its client's behalf (RUN_STARTED goes out)."""
    def note_state(self, port: SessionPort) -> None:
        """A run's metadata changed: the cluster's record of the session is written again."""
    def send(self, session_id: str, out: "Outbound") -> bool:
        """Send to the session wherever it lives; False if it is gone."""
    def open_call(self, session_id: str, call_id: str, run_id: str | None) -> bool:
        """Open a call of the application's in a session another node holds."""
    def report(self, session_id: str, report: "Report") -> bool:
        """What a call run here came to, to its session wherever it lives."""
    def lookup(self, session_id: str) -> dict[str, Any] | None:
        """The fields of a session another node holds (docs/PROTOCOL.md §12), else None."""
    def forward(self, session_id: str, user_id: str, body: bytes) -> None:
        """A body of native messages for the session, to wherever it lives (a POST's)."""
    @property
    def node_id(self) -> str | None:
        """This process's node id in a cluster; None alone."""
    @property
    def other_live_nodes(self) -> Callable[[], list[str]] | None:
        """The other live nodes' ids, asked of the cluster; None alone."""
