"""A session as a node holds it, and what can be delivered to it wherever it lives.

A ``LiveSession`` is a protocol session plus what only a running server has: its
attached transport (through its port), the cluster's link while a cluster hub follows
it, and its tool runner. It calls nothing above it: applying an operation changes its
core and rings its writer's ``Bell`` (the event loop runs the writer, on a stack of its
own); the events the core buffered are drained by whoever made the call (the session
layer: ``port.py`` and ``engine.py``). A port's write-behind stage (``Stage``: on Redis,
the journal) is here too, so that the journal hands a batch back without calling up.

What can be delivered to a session wherever it lives is one of the typed operations
below (``Send``, ``ToolUpdate``, ``ToolDone``, ``FailCall``): each applies itself to a
session's core and encodes itself for another node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from gevent import getcurrent

from .bell import SILENT, Bell
from .clock import now_ms
from .core import messages
from .core.errors import ERRORS_BY_CODE, ProtoError
from .core.session import ProtocolSession

if TYPE_CHECKING:
    from .tool_runner import Report, SessionToolRunner


class Transport(Protocol):
    """What the registry and the session layer know of a transport (its port)."""

    kind: str  # "websocket" | "sse" | "stream"
    #: rung when the session has messages for it
    bell: Bell

    def close(self, code: int, reason: str) -> None:
        """Write what is pending, then close with ``code`` (WebSocket) or end the stream."""


# where a port's batch is in its write-behind stage
IDLE, HANDING, HELD = 0, 1, 2


class Stage:
    """A port's write-behind stage: on Redis a batch is handed to the journal before the
    writer frames it. ``state`` says where the port's batch is; the journal's
    continuation ``release``s it here (``released``, for the writer's next take) and
    rings the writer's bell: it calls nothing above it. ``settled`` is set for a closing
    writer waiting for the batch."""

    __slots__ = ("state", "released", "settled", "bell")

    def __init__(self, bell: Bell = SILENT) -> None:
        self.state = IDLE
        self.released: list[tuple[int, bytes]] | None = None
        self.settled: Any = None  # a gevent Event while a closing writer waits
        self.bell = bell

    def release(self, ready: list[tuple[int, bytes]]) -> None:
        """The stage has the batch (``ready``; [] when the session moved meanwhile). Runs
        in the journal's greenlet or the loop's: never blocks."""
        held = self.state == HELD
        self.state = IDLE
        self.released = ready or None
        if held:
            if self.settled is not None:
                self.settled.set()
            self.bell.ring_anyway()  # (the port's bell: it wants what the core has)


#: the stage of a port that never shared a batch (one process: every port), shared: it
#: holds nothing, so nothing changes it (``SessionPort.take`` makes a port its own)
NO_STAGE = Stage()


# -- what can be delivered to a session wherever it lives ------------------------------


class Operation(Protocol):
    """A delivery to a session: applied to its core here, or encoded for another node."""

    name: ClassVar[str]

    def apply(self, core: ProtocolSession) -> bool: ...

    def encode(self) -> list[Any]:
        """The operation's arguments as JSON-ready data (``decode`` reads them back)."""


@dataclass(frozen=True, slots=True)
class Send:
    out: messages.Outbound
    name: ClassVar[str] = "send"

    def apply(self, core: ProtocolSession) -> bool:
        return core.send(self.out)

    def encode(self) -> list[Any]:
        return [self.out.to_dict()]

    @classmethod
    def decode(cls, args: list[Any]) -> "Send":
        return cls(messages.from_dict(args[0]))


@dataclass(frozen=True, slots=True)
class ToolUpdate:
    call_id: str
    status: str
    progress: float | None = None
    partial: Any = None
    name: ClassVar[str] = "tool_update"

    def apply(self, core: ProtocolSession) -> bool:
        return core.work.tool_update(self.call_id, self.status, self.progress, self.partial)

    def encode(self) -> list[Any]:
        return [self.call_id, self.status, self.progress, self.partial]

    @classmethod
    def decode(cls, args: list[Any]) -> "ToolUpdate":
        return cls(*args)


@dataclass(frozen=True, slots=True)
class ToolDone:
    call_id: str
    status: str
    result: Any = None
    error: ProtoError | None = None
    name: ClassVar[str] = "tool_done"

    def apply(self, core: ProtocolSession) -> bool:
        return core.work.tool_done(self.call_id, self.status, self.result, self.error)

    def encode(self) -> list[Any]:
        error = self.error.to_payload() if self.error is not None else None
        return [self.call_id, self.status, self.result, error]

    @classmethod
    def decode(cls, args: list[Any]) -> "ToolDone":
        call_id, status, result, error = args
        return cls(call_id, status, result, decode_error(error))


@dataclass(frozen=True, slots=True)
class FailCall:
    call_id: str
    error: ProtoError
    name: ClassVar[str] = "fail_call"

    def apply(self, core: ProtocolSession) -> bool:
        return core.work.fail_call(self.call_id, self.error)

    def encode(self) -> list[Any]:
        return [self.call_id, self.error.to_payload()]

    @classmethod
    def decode(cls, args: list[Any]) -> "FailCall":
        error = decode_error(args[1])
        assert error is not None
        return cls(args[0], error)


@dataclass(frozen=True, slots=True)
class OpenCall:
    """Open a call of the application's own agent (``core.work.open_call``) from the node it runs
    on, for a session another node holds (agui/remote_tool.py); False if it cannot open."""
    call_id: str
    run_id: str | None
    name: ClassVar[str] = "open_call"

    def apply(self, core: ProtocolSession) -> bool:
        try:
            core.work.open_call(self.call_id, self.run_id)
        except ProtoError:  # the run ended meanwhile, or the id is taken
            return False
        return True

    def encode(self) -> list[Any]:
        return [self.call_id, self.run_id]

    @classmethod
    def decode(cls, args: list[Any]) -> "OpenCall":
        return cls(args[0], args[1])


#: The operations by wire name, for ``decode_operation``.
OPERATIONS: dict[str, Any] = {op.name: op for op in (Send, ToolUpdate, ToolDone, FailCall,
                                                     OpenCall)}


def encode_operation(op: Operation) -> dict[str, Any]:
    """An operation as JSON-ready data: {"name": ..., "args": [...]}."""
    return {"name": op.name, "args": op.encode()}


def decode_operation(item: dict[str, Any]) -> Operation:
    """The inverse of ``encode_operation``; ValueError for an unknown name."""
    kind = OPERATIONS.get(item["name"])
    if kind is None:
        raise ValueError(f"unknown delivery operation {item['name']!r}")
    op: Operation = kind.decode(item["args"])
    return op


def decode_error(payload: dict[str, Any] | None) -> ProtoError | None:
    """A ProtoError back from its payload: its own class when the code names one."""
    if payload is None:
        return None
    cls = ERRORS_BY_CODE.get(payload["code"], ProtoError)
    exc = cls(payload.get("message"), detail=payload.get("detail"),
              related_id=payload.get("related_id"))
    if cls is ProtoError:
        exc.code = payload["code"]
    return exc


# -- a live session ------------------------------------------------------------------------


class SessionLink(Protocol):
    """How a hub that shares sessions with other processes follows one of them (set on
    the session by that hub; None in one process)."""

    #: the session moved to another process: what it writes is not this one's to send
    moved: bool

    def written(self, live: "LiveSession", ready: list[tuple[int, bytes]], now: int) -> bool:
        """The session is about to write ``ready``: share it first. False when the
        session moved to another process meanwhile (not this one's to send)."""

    def written_then(self, live: "LiveSession", ready: list[tuple[int, bytes]], now: int,
                     then: Callable[[], None]) -> bool:
        """As ``written``, without waiting: True when ``then()`` will run once ``ready``
        is shared (it must not block; ``moved`` says then whether it is still this
        process's to send); False when nothing is shared and the session writes ``ready``
        now."""

    def deliver(self, live: "LiveSession", op: Operation) -> bool:
        """Apply ``op`` here, or where the session lives now."""

    def persist(self, live: "LiveSession") -> None:
        """Before a POSTed body is answered 202: return once the cluster has the
        session's state as the body left it."""

    def note_state(self, live: "LiveSession") -> None:
        """The session's durable state changed with no message going out: share it soon."""


class LiveSession:
    """A ProtocolSession plus its transport and tool runner; every send wakes the writer.

    Slotted, and the tool runner is built by the session layer on the first tool call
    (``Engine.tool_runner``): ten thousand idle sessions are what a worker holds
    (docs/PERFORMANCE.md)."""

    __slots__ = ("core", "transport", "runner", "link", "wheel_slot")

    def __init__(self, core: ProtocolSession) -> None:
        self.core = core
        #: the attached transport's port (None while disconnected)
        self.transport: Transport | None = None
        #: None until a tool call needs it (None reads as nothing running or queued)
        self.runner: "SessionToolRunner | None" = None
        self.link: SessionLink | None = None  # set by a cluster hub while it follows it
        #: the heartbeat wheel's slot it waits in (wheel.py; -1: none)
        self.wheel_slot = -1

    @property
    def id(self) -> str:
        return self.core.id

    @property
    def user_id(self) -> str:
        return self.core.user_id

    def has_writable(self) -> bool:
        """Whether the core has messages for the wire (the port asks its queue itself:
        every message does)."""
        return self.core.outbound.has_writable()

    def take_writable(self, now: int) -> list[tuple[int, bytes]]:
        """The core's messages ready for the wire, shared first when clustered."""
        ready = self.core.outbound.take_writable(now)
        if ready and self.link is not None and not self.link.written(self, ready, now):
            return []
        return ready

    def take_writable_then(self, now: int, stage: Stage) -> list[tuple[int, bytes]] | None:
        """``take_writable`` for a writer that need not wait while a cluster shares the
        messages first: None when they went to be shared, and ``stage.release(ready)``
        runs once they are (with [] if the session moved meanwhile), in another greenlet
        or the loop's own."""
        ready = self.core.outbound.take_writable(now)
        link = self.link
        if not ready or link is None:
            return ready
        outbound = self.core.outbound
        # held for the cluster, they count as being written: back-pressure, and a client
        # that floods while they wait is a slow consumer, as when a write is blocked
        held = 0
        for _, data in ready:
            held += len(data)
        outbound.set_in_flight(held)

        def shared() -> None:
            outbound.set_in_flight(0)
            stage.release(ready if not link.moved else [])

        if link.written_then(self, ready, now, shared):
            return None
        outbound.set_in_flight(0)
        return ready

    def set_in_flight(self, nbytes: int) -> None:
        """The transport is writing ``nbytes`` (0 once written): back-pressure reads it."""
        self.core.set_in_flight(nbytes)

    def written(self) -> None:
        """The transport wrote what it took without waiting (never in flight)."""
        outbound = self.core.outbound
        if outbound.paused_by_server:  # OutboundQueue.written's own test, saving a call
            outbound.written()

    def notify_plain(self) -> None:
        """Move queued messages toward the client: ring the transport's bell (which asks
        whether the core has any), or while disconnected stamp them into the replay
        window for a later resume. (The events the core buffered are the caller's to
        drain: nothing here calls up.)"""
        transport = self.transport
        if transport is not None:
            transport.bell.ring()
        elif self.core.outbound.has_writable():
            self.take_writable(now_ms())

    def notify_fast(self) -> None:
        """``notify_plain`` with ``Bell.ring``'s first test read here: a ring from the
        greenlet that pulls anyway (a WebSocket's reader, after each message: three
        times a tool call) is dropped without the call."""
        transport = self.transport
        if transport is not None:
            bell = transport.bell
            puller = bell.puller
            if puller is None or getcurrent() is not puller:
                bell.ring()
        elif self.core.outbound.has_writable():
            self.take_writable(now_ms())

    #: the swap point: every message and every send takes it (tests/engine/test_notify.py
    #: rings over both)
    notify = notify_fast

    def apply(self, op: Operation) -> bool:
        """Deliver ``op`` to this session (or, once it moved, where it lives now)."""
        if self.link is not None:
            return self.link.deliver(self, op)
        return self.run(op)

    def run(self, op: Operation) -> bool:
        """Apply ``op`` to this process's copy of the session and wake its writer."""
        result = op.apply(self.core)
        self.notify()
        return result

    def send(self, out: messages.Outbound) -> bool:
        return self.apply(Send(out))

    def tool_update(self, call_id: str, status: str, progress: float | None = None,
                    partial: Any = None) -> bool:
        return self.apply(ToolUpdate(call_id, status, progress, partial))

    def tool_done(self, call_id: str, status: str, result: Any = None,
                  error: ProtoError | None = None) -> bool:
        if self.link is None:  # the common case, without the operation object
            done = self.core.work.tool_done(call_id, status, result, error)
            self.notify()
            return done
        return self.apply(ToolDone(call_id, status, result, error))

    def fail_call(self, call_id: str, exc: ProtoError) -> bool:
        return self.apply(FailCall(call_id, exc))

    def report(self, report: "Report") -> bool:
        """Apply what a tool runner reported of a call (``tool_runner.Report``)."""
        kind = report.kind
        if kind == "done":
            return self.tool_done(report.call_id, report.status, report.result)
        if kind == "fail":
            assert report.error is not None
            return self.fail_call(report.call_id, report.error)
        return self.tool_update(report.call_id, report.status)


