"""The parts of a session that most sessions never use, made on first use, and the views
of its parts that callers read.

An idle session (handshaken, nothing open: what a worker holds ten thousand of) has no
open texts, runs or tool calls, so it keeps no ``OpenTexts``, ``CallRegistry`` or
``Work`` (with its three callbacks into the session): each is made the first time the
session, the application or a hand-over asks for it, and is the same object from then
on. Reading a view (``runs``, ``calls``) makes nothing: an empty view is shared. Every
object a session keeps is walked by each young collection it survives
(docs/PERFORMANCE.md, "Fewer objects per session").

``SessionParts`` is ``ProtocolSession``'s base (session.py): the state machine there,
what it is made of here.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from .calls import Call, CallRegistry, Run
from .heartbeat import Heartbeat
from .seen import SeenMemory
from .texts import OpenTexts
from .work import Work

if TYPE_CHECKING:
    from .outbound import OutboundQueue
    from .meter import Meter
    from .messages import Outbound
    from .replay import ReplayWindow
    from .settings import SessionSettings

#: what ``runs`` and ``calls`` read while a session has had none (read-only, shared)
_NONE: Mapping[str, Any] = MappingProxyType({})


class SessionParts(Heartbeat, SeenMemory):
    """The session's parts. Its heartbeat (heartbeat.py) and the upstream seqs it has
    seen (seen.py) are its bases, not parts: every session keeps both, so they are six
    slots of the session's own (``settings`` among them), not two objects more
    (``heartbeat`` and ``up_seqs`` read the session itself)."""

    __slots__ = ("_texts", "_registry", "_work", "highest", "_missing")

    # set by ProtocolSession.__init__ (declared here for the views below)
    id: str
    meter: Meter
    events: list[Any]
    outbound: OutboundQueue

    def __init__(self, settings: SessionSettings, now: int) -> None:
        Heartbeat.__init__(self, settings, now)
        self.highest = 0  # SeenMemory's start: nothing seen
        self._missing = 0
        self._texts: OpenTexts | None = None
        self._registry: CallRegistry | None = None
        self._work: Work | None = None

    # -- made on first use ---------------------------------------------------------------

    @property
    def texts(self) -> OpenTexts:
        """The texts open (started, not ended): message_id -> Text (texts.py)."""
        texts = self._texts
        if texts is None:
            texts = self._texts = OpenTexts(self.settings, self.meter)
        return texts

    @property
    def registry(self) -> CallRegistry:
        """The runs and tool calls open, charged to the session's meter (calls.py)."""
        registry = self._registry
        if registry is None:
            registry = self._registry = CallRegistry(self.settings.max_concurrent_runs,
                                                     self.meter)
        return registry

    @property
    def work(self) -> Work:
        """The runs and tool calls: the client's and the application's (work.py)."""
        work = self._work
        if work is None:
            work = self._work = Work(self.id, self.registry, self.send, self._fail,
                                     self.events, self._next)
        return work

    @property
    def has_work(self) -> bool:
        """Whether a run or a tool call is open (without making the registry)."""
        registry = self._registry
        return registry is not None and bool(registry.runs or registry.calls)

    def export_work(self) -> tuple[list[list[Any]], dict[str, list[str | None]]]:
        """The registry's ``export`` (runs, calls), made of nothing while none is open."""
        registry = self._registry
        return registry.export() if registry is not None else ([], {})

    def has_texts(self) -> bool:
        """Whether a text is open (without making the table)."""
        return bool(self._texts)

    # -- views of the parts callers read --------------------------------------------------

    @property
    def heartbeat(self) -> Heartbeat:
        """The heartbeat: the session itself (its base)."""
        return self

    @property
    def up_seqs(self) -> SeenMemory:
        """The upstream seqs seen: the session itself (its base)."""
        return self

    @property
    def upstream_seq(self) -> int:
        """The highest upstream seq seen."""
        return self.highest

    @property
    def runs(self) -> Mapping[str, Run]:
        registry = self._registry
        return registry.runs if registry is not None else _NONE

    @property
    def calls(self) -> Mapping[str, Call]:
        registry = self._registry
        return registry.calls if registry is not None else _NONE

    @property
    def replay(self) -> ReplayWindow:
        return self.outbound.replay

    @property
    def pending(self) -> list[Outbound]:
        return self.outbound.pending

    @property
    def downstream_seq(self) -> int:
        return self.outbound.downstream_seq

    @property
    def unsent_bytes(self) -> int:
        return self.outbound.unsent_bytes

    # -- what the parts call back (ProtocolSession's) -----------------------------------

    def send(self, out: Outbound) -> bool:
        raise NotImplementedError

    def _fail(self, exc: Any) -> None:
        raise NotImplementedError

    def _next(self) -> int:
        raise NotImplementedError
