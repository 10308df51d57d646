"""The session registry and outbound delivery, behind one small interface.

``Hub`` is the seam: the engine and the transports only use its methods, so the
in-memory ``LocalHub`` here and a Redis-backed hub can be swapped without touching
the core or the transports. A ``LiveSession`` is a protocol session plus what only
a running server has: its attached transport and its tool runner.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from .core import messages
from .core.errors import ProtoError, SessionNotFound
from .core.session import ProtocolSession, SessionSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .config import ServerConfig
    from .tools import SessionToolRunner


def now_ms() -> int:
    return int(time.time() * 1000)


class Transport(Protocol):
    """What a transport offers the session layer. Implementations only frame bytes."""

    kind: str  # "websocket" | "sse" | "stream"

    def wake(self) -> None:
        """The session has messages to write: write them soon, never blocking the caller."""

    def close(self, code: int, reason: str) -> None:
        """Write what is pending, then close with ``code`` (WebSocket) or end the stream."""


class LiveSession:
    """A ProtocolSession plus its transport and tool runner; every send wakes the writer.

    Two hooks belong to a cluster hub: ``journal`` sees every batch of stamped messages
    before a transport writes it (so the replay window survives this node), and
    ``moved`` is set once another node took the session over: tool results that finish
    here afterwards are forwarded there."""

    def __init__(self, core: ProtocolSession,
                 on_events: Callable[["LiveSession", list[Any]], None] | None = None) -> None:
        self.core = core
        self.transport: Transport | None = None
        self.runner: "SessionToolRunner | None" = None
        self.on_events = on_events  # the engine's dispatcher for events sends cause
        self.journal: Callable[["LiveSession", list[tuple[int, bytes]], int], None] | None = None
        self.journaled_seq = 0
        self.moved: Callable[[str, str, tuple[Any, ...]], bool] | None = None

    @property
    def id(self) -> str:
        return self.core.id

    @property
    def user_id(self) -> str:
        return self.core.user_id

    def take_writable(self, now: int) -> list[tuple[int, bytes]]:
        """The core's messages ready for the wire, journaled first when clustered."""
        ready = self.core.take_writable(now)
        if ready and self.journal is not None:
            self.journal(self, ready, now)
            if self.moved is not None:
                return []  # taken over by another node meanwhile: not this node's to send
        return ready

    def notify(self) -> None:
        """Move queued messages toward the client: wake the transport, or while
        disconnected stamp them into the replay window for a later resume."""
        if self.core.has_writable():
            transport = self.transport
            if transport is not None:
                transport.wake()
            else:
                self.take_writable(now_ms())
        if self.on_events is not None and self.core.has_events():
            self.on_events(self, self.core.take_events())

    def apply(self, op: str, args: tuple[Any, ...]) -> bool:
        """Run one delivery operation (see ``OPERATIONS``) on this session."""
        if self.moved is not None:
            return self.moved(self.id, op, args)
        return OPERATIONS[op](self, *args)

    def send(self, out: messages.Outbound) -> bool:
        return self.apply("send", (out,))

    def tool_update(self, call_id: str, status: str, progress: float | None = None,
                    partial: Any = None) -> bool:
        return self.apply("tool_update", (call_id, status, progress, partial))

    def tool_done(self, call_id: str, status: str, result: Any = None,
                  error: ProtoError | None = None) -> bool:
        return self.apply("tool_done", (call_id, status, result, error))

    def fail_call(self, call_id: str, exc: ProtoError) -> bool:
        return self.apply("fail_call", (call_id, exc))


@dataclass(frozen=True, slots=True)
class SessionHost:
    """What a hub may ask of the session layer above it; the engine builds it."""

    settings: SessionSettings  # core.session settings
    adopt: Callable[[ProtocolSession], LiveSession]  # wrap a session moved here
    close_transport: Callable[[LiveSession, int, str], None]
    #: this node's /stats figures (docs/PROTOCOL.md §10) plus ``errorsSent``, the number of
    #: ERROR messages sent (a cluster weighs every node's error rate with it)
    local_stats: Callable[[], dict[str, Any]]
    receive_body: Callable[[LiveSession, bytes], int]  # a body another node forwarded


def _send(live: LiveSession, out: messages.Outbound) -> bool:
    queued = live.core.send(out)
    live.notify()
    return queued


def _tool_update(live: LiveSession, call_id: str, status: str, progress: float | None,
                 partial: Any) -> bool:
    sent = live.core.tool_update(call_id, status, progress, partial)
    live.notify()
    return sent


def _tool_done(live: LiveSession, call_id: str, status: str, result: Any,
               error: ProtoError | None) -> bool:
    done = live.core.tool_done(call_id, status, result, error)
    live.notify()
    return done


def _fail_call(live: LiveSession, call_id: str, exc: ProtoError) -> bool:
    failed = live.core.fail_call(call_id, exc)
    live.notify()
    return failed


#: What can be delivered to a session wherever it lives: name -> (live, *args) -> bool.
OPERATIONS: dict[str, Callable[..., bool]] = {
    "send": _send, "tool_update": _tool_update, "tool_done": _tool_done,
    "fail_call": _fail_call,
}


class Hub(abc.ABC):
    """Session registry + delivery. One per server process; a cluster hub shares the
    registry and delivery with the other processes and nodes.

    The methods with a body are what a single process needs of a cluster hook: nothing."""

    @abc.abstractmethod
    def add(self, live: LiveSession) -> None: ...

    @abc.abstractmethod
    def get(self, session_id: str) -> LiveSession | None:
        """A session held by this process."""

    @abc.abstractmethod
    def remove(self, session_id: str) -> LiveSession | None:
        """Forget a session for good (expired or closed)."""

    @abc.abstractmethod
    def sessions(self) -> Iterable[LiveSession]:
        """The sessions this process holds."""

    @abc.abstractmethod
    def deliver(self, session_id: str, op: str, *args: Any) -> bool:
        """Run a delivery operation on a session wherever it lives and return its result
        (True for one handed to another process); SessionNotFound if there is none."""

    @abc.abstractmethod
    def broadcast(self, out: messages.Outbound) -> int:
        """Send to every connected session; returns how many it reached in this process."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    # -- cluster hooks -----------------------------------------------------------------

    def bind(self, host: SessionHost) -> None:
        """The session layer this hub serves (it builds the sessions a cluster hub takes
        over)."""
        return None  # a hook: nothing to do in one process

    def start(self) -> None:
        """The server is serving: start any background work (called in its hub)."""
        return None  # a hook: nothing to do in one process

    def stop(self) -> None:
        """The server stopped: end background work, leave the cluster."""
        return None

    def claim(self, session_id: str, user_id: str) -> LiveSession | None:
        """Move a session that lives elsewhere in the cluster into this process."""
        return None

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        """The scalar session fields (docs/PROTOCOL.md §12) of a session held by another process."""
        return None

    def forward_upstream(self, session_id: str, user_id: str, body: bytes) -> bool:
        """Hand a POSTed body to the process that holds the session; False if none does."""
        return False

    def hand_off(self, live: LiveSession) -> None:
        """This process is stopping: a cluster keeps the session for a resume elsewhere;
        alone, it ends with the process."""
        self.remove(live.id)

    def cancel_elsewhere(self, session_id: str, call_id: str) -> None:
        """Stop a tool call that started on the node that held the session before."""
        return None

    def changed(self, live: LiveSession) -> None:
        """A session was attached or detached (its shared record may need updating)."""
        return None  # a hook: nothing to do in one process

    def state_changed(self, live: LiveSession) -> None:
        """The session's durable state changed with no message going out (a tool call
        opened): a cluster hub shares it soon, so a node taking the session over knows."""
        return None  # a hook: nothing to do in one process

    def cluster_stats(self, local: dict[str, Any]) -> dict[str, Any]:
        """Statistics for the whole cluster, given this process's own."""
        return local

    def sessions_elsewhere(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                         bool]:
        """Sessions of ``user_id`` (every user's for None) that other processes hold or
        keep, as dashboard rows (``lookup``'s fields plus ``transport``), at most
        ``limit``; and whether the search was complete (a cluster bounds its scan)."""
        return [], True

    def metrics_registry(self, local: "CollectorRegistry") -> "CollectorRegistry":
        """What /metrics serves, given this process's registry: a cluster merges every
        node's, each sample labelled with its node."""
        return local

    def health(self) -> str:
        """"ok", or "degraded" when the cluster backend is unreachable."""
        return "ok"


class LocalHub(Hub):
    """In-memory hub: every session of one process in a dict."""

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}

    def add(self, live: LiveSession) -> None:
        self._sessions[live.id] = live

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: str) -> LiveSession | None:
        return self._sessions.pop(session_id, None)

    def sessions(self) -> list[LiveSession]:
        return list(self._sessions.values())

    def deliver(self, session_id: str, op: str, *args: Any) -> bool:
        live = self._sessions.get(session_id)
        if live is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return live.apply(op, args)

    def broadcast(self, out: messages.Outbound) -> int:
        return broadcast_local(self.sessions(), out)

    def __len__(self) -> int:
        return len(self._sessions)


def broadcast_local(sessions: Iterable[LiveSession], out: messages.Outbound) -> int:
    reached = 0
    for live in sessions:
        if live.core.connected:
            live.send(out)
            reached += 1
    return reached


def make_hub(config: "ServerConfig") -> Hub:
    """The hub the configuration asks for: Redis-backed with ``redisUrl``, else in memory."""
    if config.redis_url:
        from .cluster import RedisHub

        return RedisHub(config.redis_url, config.redis_prefix)
    return LocalHub()
