"""This node's record of a session it holds or held (the ``SessionLink`` a cluster hub
sets on the LiveSession): whether its messages are journaled, the epoch it holds it at,
and whether it moved away."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..clock import now_ms

if TYPE_CHECKING:
    from ..live import LiveSession, Operation
    from .routing import RoutingHub


class Follow:
    """This node's record of a session it holds or held (the ``SessionLink`` it sets on
    the LiveSession): whether its messages are journaled, up to which seq, and whether it
    moved to another node (then deliveries made here, say by a tool call still running
    here, are forwarded there)."""

    __slots__ = ("hub", "journaled_seq", "epoch", "journaling", "moved")

    def __init__(self, hub: "RoutingHub", journaled_seq: int, epoch: int) -> None:
        self.hub = hub
        self.journaled_seq = journaled_seq
        self.epoch = epoch  # the fence: every write of this node to the session carries it
        self.journaling = True
        self.moved = False

    def written(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int) -> bool:
        if not self.journaling:
            return True
        self.hub.journal.append(live, self, ready, now)
        return not self.moved  # taken over by another node meanwhile: not ours to send

    def written_then(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int,
                     then: Callable[[], None]) -> bool:
        if not self.journaling:
            return False
        self.hub.journal.append(live, self, ready, now, then)
        return True

    def deliver(self, live: LiveSession, op: Operation) -> bool:
        if self.moved:
            return self.hub.forward_moved(live.id, op)
        return live.run(op)

    def persist(self, live: LiveSession) -> None:
        """Before a POSTed body is answered 202: returns once Redis has the session's
        state as the body left it (group-committed), so a holder that dies right after
        cannot leave a 202 for messages no other node knows it received."""
        if self.journaling and self.hub.get(live.id) is live:
            self.hub.journal.append(live, self, [], now_ms())

    def note_state(self, live: LiveSession) -> None:
        """The session's durable state changed with no message going out (a tool call
        opened): shared with the next batch, so a node taking the session over knows."""
        if self.hub.get(live.id) is not None:
            self.hub.journal.note_state(live)
