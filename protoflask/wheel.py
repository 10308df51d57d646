"""The heartbeat wheel: the worker's tick touches only the sessions that are due.

Every session is in one slot of the wheel, at its next deadline: its PING to send, the
PONG it waits for timing out, its expiry while disconnected, the oldest entry of its
replay window falling out of ``replayWindowTime``. A tick takes the slots that came due
and, for each session in them, does what the tick did for every session before (the
core's ``tick``, then ``settle``), then puts it back at its next deadline.

Nothing has to move a session in the wheel when it changes. Every change that can bring
a deadline nearer makes it at least ``reach`` from the moment of the change (an attach:
the next PING one heartbeatInterval away; a detach: the expiry replayWindowTime away; a
message stored in the window: replayWindowTime away; a PONG: the next PING, set when the
PING went), with ``reach`` the smaller of the two. So a session is put back at its
deadline or ``reach`` from now, whichever is sooner, and is never visited late: at
worst early, when it is just put back. Idle sessions are visited once a heartbeat
interval, when their PING is due anyway.

``turn_all`` (the walk over every session) is the wheel's reference: a test holds the
two to the same PINGs, timeouts and expiries (tests/engine/test_wheel.py).
"""

from __future__ import annotations

import heapq
import logging
from typing import Callable

from .config import ServerConfig
from .core.session import ProtocolSession
from .hub import Hub
from .live import LiveSession
from .ticker import tick_period

log = logging.getLogger("protoflask")


def deadline(core: ProtocolSession) -> int | None:
    """When the session next has something for the tick to do (ms), or None."""
    settings = core.settings
    due: int | None = None
    if core.connected:
        beat = core.heartbeat
        due = beat.sent_at + settings.heartbeat_timeout if beat.nonce is not None \
            else beat.next_at
    elif not core.closed and core.disconnected_at is not None:
        due = core.disconnected_at + settings.replay_window_time
    replay = core.outbound.replay
    oldest = replay.oldest_at
    if oldest is not None:
        expires = oldest + replay.time_ms + 1  # prune: older than the horizon
        due = expires if due is None or expires < due else due
    return due


def reach(core: ProtocolSession) -> int:
    settings = core.settings
    return max(1, min(settings.heartbeat_interval, settings.replay_window_time,
                      core.outbound.replay.time_ms))


class HeartbeatWheel:
    """Sessions by the slot (of ``slot_ms``) their next deadline falls in."""

    def __init__(self, config: ServerConfig, hub: Hub,
                 settle: Callable[[LiveSession], None]) -> None:
        self.period = tick_period(config)
        self.slot_ms = max(1, int(self.period * 500))  # half the tick's period
        self.hub = hub
        self.settle = settle  # after the core's tick: act on its events, wake the writer
        self._count = 0  # sessions in the wheel (each knows its slot: ``wheel_slot``)
        self._slots: dict[int, dict[LiveSession, None]] = {}  # insertion-ordered
        self._heap: list[int] = []  # the slots' numbers
        self._missing: set[LiveSession] = set()  # not in the hub at their last visit

    def __len__(self) -> int:
        return self._count

    def add(self, live: LiveSession, at: int) -> None:
        """Visit ``live`` at the first tick at or after ``at`` (ms), unless sooner."""
        slot = -(-at // self.slot_ms)  # the first slot starting at or after ``at``
        current = live.wheel_slot
        if current >= 0 and current <= slot:
            return
        if current < 0:
            self._count += 1
        else:  # to a sooner slot: out of the later one
            self._slots.get(current, {}).pop(live, None)
        live.wheel_slot = slot
        bucket = self._slots.get(slot)
        if bucket is None:
            bucket = self._slots[slot] = {}
            heapq.heappush(self._heap, slot)
        bucket[live] = None

    def discard(self, live: LiveSession) -> None:
        """``live`` is gone for good (expired, dropped, closed): out of the wheel now, not
        at its slot, which may be up to ``reach`` away (a heartbeatInterval): until then
        its slot would keep the whole session (its replay window, its queue) that the
        hub and the memory budget let go of (a user who opens, fills and drops sessions
        would hold that much memory uncounted)."""
        slot = live.wheel_slot
        self._missing.discard(live)
        if slot < 0:
            return
        # (a slot being turned is out of _slots already; an emptied one goes at its turn)
        self._slots.get(slot, {}).pop(live, None)
        live.wheel_slot = -1
        self._count -= 1

    def turn(self, now: int) -> int:
        """Visit every session due by ``now``; returns how many were visited."""
        heap, slots = self._heap, self._slots
        last = now // self.slot_ms
        visited = 0
        while heap and heap[0] <= last:
            slot = heapq.heappop(heap)
            for live in slots.pop(slot, ()):
                if live.wheel_slot != slot:
                    continue  # discarded by an earlier visit of this turn
                live.wheel_slot = -1
                self._count -= 1
                visited += 1
                self._visit(live, now)
        return visited

    def _visit(self, live: LiveSession, now: int) -> None:
        core = live.core
        if core.closed:
            self._missing.discard(live)
            return
        if self.hub.get(live.id) is not live:
            # adopted but not in the hub yet, or moved away: once more, then forgotten
            if live in self._missing:
                self._missing.discard(live)
                return
            self._missing.add(live)
            self.add(live, now + reach(core))
            return
        self._missing.discard(live)
        self.visit(live, now)
        if core.closed or self.hub.get(live.id) is not live:
            return
        due = deadline(core)
        soonest = now + reach(core)
        self.add(live, soonest if due is None or due > soonest else max(due, now + 1))

    def turn_all(self, sessions: list[LiveSession], now: int) -> None:
        """The walk the wheel replaces: every session visited (the reference)."""
        for live in sessions:
            self.visit(live, now)

    def visit(self, live: LiveSession, now: int) -> None:
        """What the tick does to a due session."""
        live.core.tick(now)
        self.settle(live)
