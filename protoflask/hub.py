"""The session registry and outbound delivery, behind one small interface.

``Hub`` is the seam: the engine and the transports only use its methods, so the
in-memory ``LocalHub`` here and a Redis-backed hub can be swapped without touching
the core or the transports. A ``LiveSession`` is a protocol session plus what only
a running server has: its attached transport and its tool runner.
"""

from __future__ import annotations

import abc
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from .core import messages
from .core.errors import ProtoError
from .core.session import ProtocolSession

if TYPE_CHECKING:
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
    """A ProtocolSession plus its transport and tool runner; every send wakes the writer."""

    def __init__(self, core: ProtocolSession,
                 on_events: Callable[["LiveSession", list[Any]], None] | None = None) -> None:
        self.core = core
        self.transport: Transport | None = None
        self.runner: "SessionToolRunner | None" = None
        self.on_events = on_events  # the engine's dispatcher for events sends cause

    @property
    def id(self) -> str:
        return self.core.id

    @property
    def user_id(self) -> str:
        return self.core.user_id

    def notify(self) -> None:
        """Move queued messages toward the client: wake the transport, or while
        disconnected stamp them into the replay window for a later resume."""
        if self.core.has_writable():
            transport = self.transport
            if transport is not None:
                transport.wake()
            else:
                self.core.take_writable(now_ms())
        if self.on_events is not None and self.core.has_events():
            self.on_events(self, self.core.take_events())

    def send(self, out: messages.Outbound) -> bool:
        queued = self.core.send(out)
        self.notify()
        return queued

    def tool_update(self, call_id: str, status: str, progress: float | None = None,
                    partial: Any = None) -> bool:
        sent = self.core.tool_update(call_id, status, progress, partial)
        self.notify()
        return sent

    def tool_done(self, call_id: str, status: str, result: Any = None,
                  error: ProtoError | None = None) -> bool:
        done = self.core.tool_done(call_id, status, result, error)
        self.notify()
        return done

    def fail_call(self, call_id: str, exc: ProtoError) -> bool:
        failed = self.core.fail_call(call_id, exc)
        self.notify()
        return failed


class Hub(abc.ABC):
    """Session registry + delivery. One per server process (or cluster, when shared)."""

    @abc.abstractmethod
    def add(self, live: LiveSession) -> None: ...

    @abc.abstractmethod
    def get(self, session_id: str) -> LiveSession | None: ...

    @abc.abstractmethod
    def remove(self, session_id: str) -> LiveSession | None: ...

    @abc.abstractmethod
    def sessions(self) -> Iterable[LiveSession]: ...

    @abc.abstractmethod
    def deliver(self, session_id: str, out: messages.Outbound) -> bool:
        """Send to one session wherever it lives; False if there is no such session."""

    @abc.abstractmethod
    def broadcast(self, out: messages.Outbound) -> int:
        """Send to every connected session; returns how many it reached here."""

    @abc.abstractmethod
    def __len__(self) -> int: ...


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

    def deliver(self, session_id: str, out: messages.Outbound) -> bool:
        live = self._sessions.get(session_id)
        if live is None:
            return False
        live.send(out)
        return True

    def broadcast(self, out: messages.Outbound) -> int:
        reached = 0
        for live in self.sessions():
            if live.core.connected:
                live.send(out)
                reached += 1
        return reached

    def __len__(self) -> int:
        return len(self._sessions)
