"""This node's record of a session it holds or held (the ``SessionLink`` a cluster hub
sets on the LiveSession): whether its messages are journaled, the epoch it holds it at,
whether it moved away, and the ids of the deliveries from other nodes it applied last."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

import gevent

from ..clock import now_ms

if TYPE_CHECKING:
    from ..live import LiveSession, Operation
    from .routing import RoutingHub

log = logging.getLogger("protoflask.cluster")


#: s a holder waits for its writer to take a delivery before it confirms it (below the
#: sender's DELIVERY_WAIT; a client without credit holds it longer: then it is confirmed
#: as queued in memory, as a message waiting for credit always is)
KEEP_WAIT = 1.0
KEEP_POLL = 0.002

#: how many ids of deliveries from other nodes a session remembers (its last ones; they
#: move with its state): a delivery its holder did not confirm is queued again for the
#: holder's next beat or the next holder, and that copy is skipped when the first one
#: was applied. A copy comes after at most the deliveries applied within the sender's
#: wait (DELIVERY_WAIT) and a take-over; this bound is far above those.
DELIVERED_KEPT = 64


def unjournaled(live: LiveSession, ready: list[tuple[int, bytes]]) -> None:
    """Messages stamped for a session this node no longer journals (it let it go)."""
    if ready and log.isEnabledFor(logging.DEBUG):
        log.debug("session %s: seqs %d-%d stamped after this node stopped journaling it",
                  live.id, ready[0][0], ready[-1][0])


def not_sent(live: LiveSession, ready: list[tuple[int, bytes]]) -> None:
    """Messages stamped for a session after it moved to another node (its transport's
    close on its way): not written, since the node holding it now gives those seqs to
    its own messages; written, they would reach the client twice under one seq with
    different content (said, not dropped in silence)."""
    if ready:
        log.warning("session %s: seqs %d-%d stamped after it moved to another node are "
                    "not sent from here", live.id, ready[0][0], ready[-1][0])


class Follow:
    """This node's record of a session it holds or held (the ``SessionLink`` it sets on
    the LiveSession): whether its messages are journaled, up to which seq, and whether it
    moved to another node (then deliveries made here, say by a tool call still running
    here, are forwarded there)."""

    __slots__ = ("hub", "journaled_seq", "committed_seq", "epoch", "journaling", "moved",
                 "delivered", "record_due")

    def __init__(self, hub: "RoutingHub", journaled_seq: int, epoch: int,
                 delivered: Iterable[str] = ()) -> None:
        self.hub = hub
        self.journaled_seq = journaled_seq
        #: the last seq Redis is known to have (a flush wrote it; the window this node
        #: holds the session with came from Redis, or was copied there): a replay at or
        #: below it goes to the wire without waiting for a batch (journal.append)
        self.committed_seq = journaled_seq
        self.epoch = epoch  # the fence: every write of this node to the session carries it
        self.journaling = True
        self.moved = False
        #: the ids of the last deliveries from other nodes applied to the session (here,
        #: or before it moved here: they are in the state the journal writes)
        self.delivered: deque[str] = deque(delivered, maxlen=DELIVERED_KEPT)
        #: the record's connected / transport fields changed (an attach, a detach) and go
        #: with the session's next journal batch (``RoutingHub.changed``)
        self.record_due = False

    def first_copy(self, delivery_id: str | None) -> bool:
        """Whether a delivery from another node is to be applied: not when its id says
        it was applied already (a copy queued again because its holder did not confirm
        it). Its id is noted first: the state the journal writes with its message has it."""
        if delivery_id is None:  # queued without one (a let-go's waiting messages)
            return True
        if delivery_id in self.delivered:
            return False
        self.delivered.append(delivery_id)
        return True

    def written(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int) -> bool:
        if self.moved:  # lost or let go: the node holding it now stamps its own seqs
            not_sent(live, ready)
            return False
        if not self.journaling:
            unjournaled(live, ready)
            return True
        self.hub.journal.append(live, self, ready, now)
        return not self.moved  # taken over by another node meanwhile: not ours to send

    def written_then(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int,
                     then: Callable[[], None]) -> bool:
        if self.moved:  # (as ``written``): the stage is released with nothing in it
            not_sent(live, ready)
            then()
            return True
        if not self.journaling:
            unjournaled(live, ready)
            return False
        self.hub.journal.append(live, self, ready, now, then)
        return True

    def deliver(self, live: LiveSession, op: Operation) -> bool:
        if self.moved:
            return self.hub.forward_moved(live.id, op)
        return live.run(op)

    def persist(self, live: LiveSession) -> None:
        """Before a POSTed body is answered 202, or a delivery from another node
        confirmed: returns once Redis has what the session wrote and its state
        (``keep``), so a holder that dies right after cannot leave a 202 or a
        confirmation for messages no other node knows of."""
        if self.hub.get(live.id) is live:
            self.keep(live)

    def note_state(self, live: LiveSession) -> None:
        """The session's durable state changed with no message going out (a tool call
        opened): shared with the next batch, so a node taking the session over knows."""
        if self.hub.get(live.id) is not None:
            self.hub.journal.note_state(live)

    def keep(self, live: LiveSession) -> None:
        """Return once Redis has what the session has for the wire now: its transport's
        writer takes it (each take is journaled first; up to KEEP_WAIT, as far as credit
        lets it go), then one group-committed batch with the state. Without a transport,
        what was sent is in the window already (``LiveSession.notify`` journals it).

        The state a batch writes is the session's as the batch is flushed, which may be
        ahead of the entries: a TOOL_CALL answered by an inline tool is closed in it while
        its TOOL_DONE still waits for a busy writer. Appending the state only after the
        writer took the TOOL_DONE puts both in the same commit (or the TOOL_DONE first)."""
        if not self.journaling:
            return
        deadline = time.monotonic() + KEEP_WAIT
        while live.transport is not None and live.has_writable() and not self.moved \
                and self.journaling and time.monotonic() < deadline:
            gevent.sleep(KEEP_POLL)
        if self.journaling:  # (the state, group-committed with what the writer took)
            self.hub.journal.append(live, self, [], now_ms())


def batch_head(live: "LiveSession") -> bytes:
    """The session's first line in a journal batch: "epoch first_seq", then, when its
    record is due (``Follow.record_due``, taken here), " connected transport", which the
    batch's script writes into the record."""
    link: Any = live.link
    core = live.core
    head = b"%d %d" % (getattr(link, "epoch", 0), core.replay.first_seq or 0)
    if getattr(link, "record_due", False):
        link.record_due = False
        transport = live.transport
        head += b" %d %s" % (core.connected, transport.kind.encode() if transport else b"")
    return head


def first_copy(live: "LiveSession", data: dict[str, Any]) -> bool:
    """Whether a delivery from another node is to be applied to the session held here
    (not a copy of one it applied already: ``Follow.first_copy``)."""
    return not isinstance(live.link, Follow) or live.link.first_copy(data.get("did"))
