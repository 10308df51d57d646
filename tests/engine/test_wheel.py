"""The heartbeat wheel (protoflask/wheel.py): a tick visits only the sessions that are
due, and they get the same PINGs, timeouts, expiries and window pruning, at the same
ticks, as the walk over every session it replaced (``turn_all``, the reference).

Time is passed in: both runs tick at the same slot-aligned instants, and the engine's
clock (an attach, a detach, a message stamped into the window) reads the tick's instant,
so the two runs are comparable tick by tick."""

from __future__ import annotations

import json
from typing import Any

import pytest

import protoflask.engine
import protoflask.live
from protoflask.clock import now_ms
from protoflask.live import LiveSession

from .test_engine import FakeTransport, Harness

INTERVAL, TIMEOUT, WINDOW = 1000, 500, 3000


def _pings(live: LiveSession, now: int) -> list[str]:
    """The nonces of the PINGs the session wrote at ``now`` (stamped at ``now``)."""
    out = [json.loads(data) for _, data in live.take_writable(now)]
    return [m["payload"]["nonce"] for m in out if m["type"] == "PING"]


def run(wheel: bool, monkeypatch: pytest.MonkeyPatch, steps: int = 120
        ) -> tuple[list[Any], Harness]:
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT,
                replayWindowTime=WINDOW)
    slot = h.engine.wheel.slot_ms
    base = (now_ms() // slot + 1) * slot
    clock = [base]
    for module in (protoflask.engine, protoflask.live):
        monkeypatch.setattr(module, "now_ms", lambda: clock[0])
    names = ("answers", "silent", "gone", "back", "texted")
    lives: dict[str, LiveSession] = {}
    transports: dict[str, FakeTransport] = {}
    for name in names:
        lives[name], transports[name] = h.connect("u-" + name)
        h.hello(lives[name])
        h.written(lives[name])
        lives[name].core.outbound.replay.ack(10**9)  # the HELLO reply: not the subject
    for name in ("gone", "back"):
        h.engine.detach(lives[name], transports[name])
    lives["texted"].core.send_text("kept for the window's time")
    live_texted = lives["texted"]
    assert live_texted.take_writable(base)
    seen: list[Any] = []
    for step in range(steps):
        clock[0] = now = base + step * slot
        if step == 1500 // slot + 1:  # a resume: its first PING one interval from now
            transports["back"] = FakeTransport()
            h.engine.attach(lives["back"], transports["back"])
        if wheel:
            h.engine.wheel.turn(now)
        else:
            h.engine.wheel.turn_all(h.hub.sessions(), now)
        row = []
        for name in names:
            live = lives[name]
            pings = _pings(live, now) if live.transport is not None else []
            if name != "silent":
                for nonce in pings:
                    h.send(live, "PONG", {"nonce": nonce}, "SYSTEM")
            row.append((name, h.hub.get(live.id) is live, live.core.closed, len(pings),
                        list(transports[name].closed), len(live.core.outbound.replay)))
        seen.append((step, row))
    return seen, h


def test_the_wheel_ticks_every_session_as_the_walk_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    walked, _ = run(False, monkeypatch)
    wheeled, h = run(True, monkeypatch)
    assert wheeled == walked
    last = dict((r[0], r[1:]) for r in walked[-1][1])
    # the scenario did what it is there for: PINGs answered and not, a timeout, an
    # expiry, a resumed session PINGed, a window pruned
    assert last["gone"][:2] == (False, True)
    assert any(r[1][1][4] for r in walked)  # "silent" timed out: its transport closed
    assert sum(r[1][0][3] for r in walked) >= 6  # "answers": a PING an interval
    assert sum(r[1][3][3] for r in walked) >= 3  # "back": PINGed after its resume
    texted = [r[1][4][5] for r in walked]  # its window: the text's 3 entries, then PINGs
    assert texted[0] == 3 and min(texted[WINDOW // h.engine.wheel.slot_ms + 1:]) < 3
    assert last["texted"][:2] == (True, False)


def test_a_tick_visits_only_the_sessions_due() -> None:
    """Ten idle sessions: the ticks between their PINGs visit none of them."""
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT)
    wheel = h.engine.wheel
    lives = [h.connect(f"u{i}")[0] for i in range(10)]
    start = now_ms()
    for live in lives:
        live.core.heartbeat.restart(start)
    assert wheel.turn(start) == 10  # new sessions: visited at the first tick
    assert wheel.turn(start + INTERVAL // 2) == 0
    assert wheel.turn(start + INTERVAL + wheel.slot_ms) == 10  # their PINGs
    assert all(live.core.heartbeat.nonce for live in lives)
    assert wheel.turn(start + INTERVAL + 2 * wheel.slot_ms) == 0


def test_a_session_gone_from_the_hub_leaves_the_wheel() -> None:
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT)
    live, _ = h.connect("u1")
    wheel = h.engine.wheel
    assert len(wheel) == 1
    h.hub.remove(live.id)  # moved to another node (not closed)
    now = now_ms()
    for k in range(4):  # twice missing: forgotten
        wheel.turn(now + k * INTERVAL)
    assert len(wheel) == 0


def _in_slots(wheel: Any) -> list[LiveSession]:
    """Every session the wheel's slots hold (what keeps one alive there)."""
    return [live for bucket in wheel._slots.values() for live in bucket]


def test_a_session_dropped_for_good_leaves_the_wheel_at_once() -> None:
    """The user's oldest kept session beyond maxKeptSessionsPerUser is dropped: gone from
    the hub and the budget, and from the wheel now, not at its slot a heartbeat interval
    on, which held it (its replay window, its queue) that long uncounted. A churn of
    100 sessions a round held 300 where the hub had 110 (the worker 2.2x the RSS)."""
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT, maxKeptSessionsPerUser=2)
    wheel = h.engine.wheel
    lives = []
    for _ in range(5):
        live, transport = h.connect("u1")
        h.hello(live)
        h.engine.detach(live, transport)
        lives.append(live)
    kept = [live for live in lives if h.hub.get(live.id) is live]
    assert kept == lives[-2:]  # the cap: the oldest three dropped
    assert all(live.core.closed for live in lives[:3])
    assert len(wheel) == 2 and set(_in_slots(wheel)) == set(kept)
    assert all(live.wheel_slot == -1 for live in lives[:3])
    wheel.turn(now_ms() + 4 * INTERVAL)  # the turn after: nothing miscounted
    assert len(wheel) == len(_in_slots(wheel))


def test_a_session_dropped_during_a_turn_is_not_visited_or_counted_twice() -> None:
    """A turn's visit can drop another session due in the same slot (a heartbeat timeout
    detaches one, the kept cap drops an older one): the turn skips it, so it is neither
    visited (and put back in the wheel) nor counted out twice."""
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT)
    wheel = h.engine.wheel
    first, _ = h.connect("u1")
    second, _ = h.connect("u1")  # both due at the first tick, in this order
    settle = wheel.settle

    def settle_and_drop(live: LiveSession) -> None:
        settle(live)
        if live is first:
            wheel.discard(second)

    wheel.settle = settle_and_drop
    assert wheel.turn(now_ms()) == 1  # the first only
    assert second.wheel_slot == -1 and _in_slots(wheel) == [first]
    assert len(wheel) == 1


def test_a_session_dropped_for_good_lets_go_of_its_window_and_queue() -> None:
    """What a dropped session held goes with it at once: its last connection's objects
    are a cycle that holds it until a full collection, which a serving worker makes
    rare (serving.SERVING_GC_THRESHOLDS); a churn of filled sessions grew the worker
    ~21 MB a round of 100 while before the port it stayed flat."""
    h = Harness(heartbeatInterval=INTERVAL, heartbeatTimeout=TIMEOUT, maxKeptSessionsPerUser=1)
    first, transport = h.connect("u1")
    h.hello(first)
    for i in range(5):
        first.core.send_text(f"text {i}")  # into the queue, then the window once written
    assert first.take_writable(now_ms())
    first.core.send_text("still queued")
    outbound = first.core.outbound
    assert len(outbound.replay) > 0 and outbound.pending
    h.engine.detach(first, transport)
    second, transport = h.connect("u1")
    h.engine.detach(second, transport)  # the cap: the first is dropped
    assert first.core.closed and h.hub.get(first.id) is None
    assert len(outbound.replay) == 0 and not outbound.pending
    assert outbound.pending_bytes == 0
    assert h.hub.get(second.id) is second and not second.core.closed
