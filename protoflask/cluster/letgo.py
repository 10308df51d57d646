"""Letting a session go to its next holder (a resume on another node, a drain): the
state this node leaves in Redis never names a seq the window there lacks.

The journal writes ahead of the wire in batches, and a batch may still be on its way to
Redis as the session is let go. The let-go's state names the last seq stamped: written
first, it had the next holder number on past seqs Redis did not have yet, and the late
batch, fenced off by then, never wrote them (a hole no REPLAY_UNAVAILABLE declares). So:

- every batch holding messages of the session is written first (``Journal.flush``
  returns once what was appended before it is; again while more were stamped meanwhile);
- then, with no turn for another greenlet until it is sent: the messages not stamped yet
  (they go first in the inbox, for the next holder to send), the state, this node no
  longer holding the session and forwarding what is delivered to it from now on;
- one let-go per session at a time: a drain and a resume elsewhere may both ask, and the
  second waits for the first (a resume answered "released" before the first let-go's
  write reached Redis would take the session from an older copy);
- a node whose journal failed meanwhile (degraded: Redis may lack some of what it
  stamped) keeps the session against a resume (503, retried once it copied its windows
  over), and copies the whole window over before it lets go when it stops.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
from gevent.event import Event

from ..clock import now_ms
from ..live import LiveSession, Send, encode_operation
from .follow import Follow
from .redis_client import UNAVAILABLE

if TYPE_CHECKING:
    from .routing import RoutingHub

log = logging.getLogger("protoflask.cluster")

#: s a second let-go of the same session waits for the first (its writes: the journal's
#: batches, then one script; Redis's socket timeout bounds each)
LEAVE_WAIT = 15.0


class LetGo:
    def __init__(self, hub: "RoutingHub") -> None:
        self.hub = hub
        self._leaving: dict[str, Event] = {}  # session id -> set once its let-go is done

    def __call__(self, live: LiveSession, stopping: bool = False) -> bool:
        """Let the session go; False when it stays here (degraded, and not ``stopping``)."""
        if self.wait(live.id):
            return True
        done = self._leaving[live.id] = Event()
        try:
            return self._let_go(live, stopping)
        finally:
            del self._leaving[live.id]
            done.set()

    def wait(self, session_id: str) -> bool:
        """If the session is being let go: wait until it is, and say so."""
        other = self._leaving.get(session_id)
        if other is None:
            return False
        other.wait(LEAVE_WAIT)
        return True

    def _let_go(self, live: LiveSession, stopping: bool) -> bool:
        hub, journal = self.hub, self.hub.journal
        if live.transport is None:
            live.take_writable(now_ms())  # as notify would: into the window, journaled
        # (with a transport, its writer stamps and writes; what it has not stamped yet
        # goes below as waiting: a stamp here would reach Redis but not its wire, and a
        # later one the writer took would leave the client a hole)
        journal.flush()
        while journal.holds(live.id) and hub.get(live.id) is live:
            journal.flush()  # stamped while the last flush waited
        if hub.get(live.id) is not live:
            return True  # taken over by another node meanwhile: nothing here to write
        if hub.degraded:  # a write failed meanwhile: Redis may lack some of the window
            if not stopping:
                return False
            try:
                copy_over(hub, live)
            except UNAVAILABLE as exc:
                hub.went_down(exc)
                return True
            if hub.get(live.id) is not live:
                return True
        link = live.link
        waiting = live.core.outbound.take_pending()
        epoch = link.epoch if isinstance(link, Follow) else 0
        state = journal.state_of(live, texts=True)
        hub.unhold(live.id)
        if isinstance(link, Follow):
            link.moved = True  # a delivery from now on goes where the session is
        calls_on = hub.calls.let_go(live)
        try:
            written = hub.store.let_go(
                live.id, epoch, live.user_id, state, calls_on,
                (orjson.dumps(encode_operation(Send(ob))) for ob in waiting))
        except UNAVAILABLE as exc:
            hub.went_down(exc)
            return True
        if not written:
            log.warning("session %s was taken over by another node before this one let "
                        "it go; its state here is dropped", live.id)
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("session %s let go at epoch %d: seq %d, journaled %d, %d waiting",
                      live.id, epoch, live.core.downstream_seq,
                      getattr(link, "journaled_seq", -1), len(waiting))
        return True


def copy_over(hub: "RoutingHub", live: LiveSession) -> None:
    """Write the session's record and whole window again (after an outage, or Redis
    losing its data), in the journal's order: after every batch taken before, before
    any taken after (a batch with later messages written first would be wiped)."""
    link = live.link
    if not isinstance(link, Follow):
        return
    with hub.journal.ordered():
        copied = hub.store.rewrite(
            live.id, link.epoch, hub.record_of(live),
            ((e.seq, e.stored_at, e.data) for e in live.core.replay))
        if copied:
            link.journaled_seq = link.committed_seq = live.core.downstream_seq
    if not copied:
        hub.lost([live.id])  # taken over while this node could not reach Redis
        return
    log.debug("session %s copied over at epoch %d: window %s-%s, seq %d", live.id,
              link.epoch, live.core.replay.first_seq, live.core.replay.last_seq,
              live.core.downstream_seq)
