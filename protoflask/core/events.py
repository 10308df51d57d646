"""What a session tells the layer above it: small immutable events.

The session buffers them as it goes; the caller drains them with
``ProtocolSession.take_events()`` after any call (the one way out, as websockets'
``events_received()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .calls import Run
from .errors import ProtoError

if TYPE_CHECKING:
    from .envelope import Message


@dataclass(frozen=True, slots=True)
class Handshake:
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextReceived:
    message: dict[str, Any]  # wire form; END carries ``text`` and ``content_type`` too


class ToolCallReceived(NamedTuple):
    """A NamedTuple where the other events are frozen dataclasses: as immutable, and
    built in a third of the time (one per TOOL_CALL, on the tool call's hot path)."""

    call_id: str
    tool: str
    params: dict[str, Any]
    run_id: str | None
    call: Message  # the TOOL_CALL

    @property
    def message(self) -> dict[str, Any]:
        """The TOOL_CALL in wire form (built when asked: nothing on the hot path reads it)."""
        return self.call.to_wire()


@dataclass(frozen=True, slots=True)
class ToolCancelRequested:
    call_id: str


@dataclass(frozen=True, slots=True)
class ToolListRequested:
    pass


@dataclass(frozen=True, slots=True)
class RunChanged:
    kind: str  # "started" | "finished" | "cancelled"
    run: Run
    cancelled_calls: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AudioReceived:
    message: dict[str, Any]
    data: bytes


@dataclass(frozen=True, slots=True)
class ErrorSent:
    error: ProtoError


@dataclass(frozen=True, slots=True)
class CloseRequested:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatTimedOut:
    pass


@dataclass(frozen=True, slots=True)
class Expired:
    pass


@dataclass(frozen=True, slots=True)
class SlowConsumer:
    """Unsent bytes passed outbound_buffer_size: the transport should be dropped."""

    unsent_bytes: int


@dataclass(frozen=True, slots=True)
class SendRefused:
    """A server message was dropped: the pending queue was full (the client withholds
    credit or paused the channel for too long), or, with ``why``, it would have taken
    the session's user or the worker over their memory budget."""

    type: str
    channel: str
    why: str | None = None


Event = (Handshake | TextReceived | ToolCallReceived | ToolCancelRequested | ToolListRequested
         | RunChanged | AudioReceived | ErrorSent | CloseRequested | HeartbeatTimedOut | Expired
         | SlowConsumer | SendRefused)
