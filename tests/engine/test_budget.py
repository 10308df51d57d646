"""The memory budget on the engine (issue 24), no sockets: texts, tool calls (queued and
of kept sessions included) and runs charged to their user at admission and refused with
the contract's code when the user (maxUserBytes) or the worker (memoryCeiling) would go
over; the tick only degrades (oldest kept session first, then the heaviest); the
running counts equal what the sessions hold."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import pytest

from protoflask.budget import held_bytes
from protoflask.core import messages
from protoflask.core.errors import MaxRunsExceeded, UserConnectionLimit
from protoflask.live import Send
from protoflask.tools import Tool

from .test_engine import Harness

KB = 1000


def errors(h: Harness, live: Any) -> list[str]:
    return [m["payload"]["code"] for m in h.written(live) if m["type"] == "ERROR"]


def part(h: Harness, live: Any, mid: str, content: str) -> list[dict[str, Any]]:
    h.send(live, "MESSAGE_PART", {"message_id": mid, "content": content}, "USER")
    return h.written(live)


def start(h: Harness, live: Any, mid: str) -> None:
    h.send(live, "MESSAGE_START", {"message_id": mid, "content_type": "text/plain"}, "USER")


def greeted(h: Harness, user: str) -> Any:
    live, _ = h.connect(user)
    h.hello(live)
    h.written(live)
    return live


def truth(h: Harness) -> dict[str, int]:
    out: dict[str, int] = {}
    for live in h.hub.sessions():
        out[live.user_id] = out.get(live.user_id, 0) + live.core.meter.held
    return out


def test_a_user_is_held_to_their_budget_over_all_their_sessions_at_admission() -> None:
    h = Harness(maxUserBytes=300 * KB, echoMessages=False)
    first, second, bystander = greeted(h, "u1"), greeted(h, "u1"), greeted(h, "u2")
    start(h, first, "a")
    start(h, second, "b")
    start(h, bystander, "c")
    part(h, bystander, "c", "z" * 250 * KB)
    assert not [m for m in part(h, first, "a", "x" * 200 * KB) if m["type"] == "ERROR"]
    # one emoji: 50,001 characters of UTF-8 bytes 50,004, held at 4 bytes a character
    out = part(h, second, "b", "\U0001F600" + "y" * 50 * KB)
    assert [m["payload"]["code"] for m in out if m["type"] == "ERROR"] == ["MESSAGE_TOO_LARGE"]
    assert "maxUserBytes" in out[-1]["payload"]["message"]
    assert "b" not in second.core.texts
    # the same length in ASCII costs a quarter: let in
    start(h, second, "b")
    assert not [m for m in part(h, second, "b", "y" * 50 * KB) if m["type"] == "ERROR"]
    accounts = h.engine.budget.accounts
    assert {u: a.held for u, a in accounts.items()} == truth(h)
    assert accounts["u1"].held <= 300 * KB
    assert "c" in bystander.core.texts  # nothing of the bystander's was touched


def test_the_worker_ceiling_refuses_anyone_once_all_sessions_hold_it() -> None:
    h = Harness(memoryCeiling=400 * KB, maxUserBytes=0, echoMessages=False)
    one, two = greeted(h, "u1"), greeted(h, "u2")
    for live, mid in ((one, "a"), (two, "b")):
        start(h, live, mid)
        part(h, live, mid, "x" * 190 * KB)
    start(h, two, "c")
    out = part(h, two, "c", "x" * 30 * KB)
    assert "memoryCeiling" in out[-1]["payload"]["message"], out
    assert h.engine.budget.held <= 400 * KB


class Gate:
    """A tool that blocks until opened: its calls stay running or queued."""

    def __init__(self) -> None:
        self.open = gevent.event.Event()

    def __call__(self, params: Any, *_: Any) -> dict[str, Any]:
        self.open.wait()
        return {}


def test_queued_tool_calls_params_count_even_in_a_kept_session() -> None:
    h = Harness(maxUserBytes=500 * KB, maxConcurrentRuns=1, toolQueueSize=10)
    gate = Gate()
    h.tools.register(Tool("gate", "blocks", {"type": "object"}, execute=gate))
    live, transport = h.connect("u1")
    h.hello(live)
    params = {"blob": "p" * 100 * KB}
    for i in range(6):
        h.send(live, "TOOL_CALL", {"call_id": f"c{i}", "tool": "gate", "params": params},
               "AGENT")
    gevent.sleep(0)
    out = h.written(live)
    done = [(m["payload"]["call_id"], m["payload"]["status"]) for m in out
            if m["type"] == "TOOL_DONE"]
    assert done == [("c4", "ERROR"), ("c5", "ERROR")], out  # four of 100 kB fit in 500 kB
    assert [m["payload"]["code"] for m in out if m["type"] == "ERROR"] == \
        ["MAX_RUNS_EXCEEDED"] * 2
    h.engine.detach(live, transport)  # kept: its queued calls still hold their params
    other, _ = h.connect("u1")
    h.hello(other)
    h.send(other, "TOOL_CALL", {"call_id": "o", "tool": "gate", "params": params}, "AGENT")
    assert errors(h, other) == ["MAX_RUNS_EXCEEDED"]
    with pytest.raises(MaxRunsExceeded):  # the application's own calls too
        h.engine.call_tool(other, "gate", params, "app", None, lambda *_: None)
    gate.open.set()
    gevent.wait([g for g in live.runner.running.values()], timeout=5)
    for _ in range(10):
        gevent.sleep(0.01)
    assert live.core.meter.held == 0 and h.engine.budget.accounts["u1"].held == 0
    h.send(other, "TOOL_CALL", {"call_id": "o2", "tool": "gate", "params": params}, "AGENT")
    assert errors(h, other) == []


def test_run_metadata_counts() -> None:
    h = Harness(maxUserBytes=150 * KB)
    live = greeted(h, "u1")
    h.send(live, "RUN_STARTED", {"run_id": "r1", "metadata": {"m": "x" * 100 * KB}}, "SYSTEM")
    h.send(live, "RUN_STARTED", {"run_id": "r2", "metadata": {"m": "x" * 100 * KB}}, "SYSTEM")
    assert errors(h, live) == ["MAX_RUNS_EXCEEDED"]
    assert set(live.core.runs) == {"r1"}


def test_the_tick_drops_the_oldest_kept_session_first_then_closes_the_heaviest() -> None:
    """What the tick sheds is what admission does not see: windows that came past it
    (a session moved here brings its window; control messages are never refused),
    filled here by the application's own texts with the budget off meanwhile."""
    h = Harness(maxUserBytes=1000 * KB, replayWindowTime=60000)
    h.engine.budget.user_budget = 0  # off while the windows fill
    old, old_t = h.connect("u1")
    h.hello(old)
    old.core.send_text("o" * 400 * KB)
    h.engine.detach(old, old_t)
    kept, kept_t = h.connect("u1")
    h.hello(kept)
    kept.core.send_text("k" * 400 * KB)
    h.engine.detach(kept, kept_t)
    live, transport = h.connect("u1")
    h.hello(live)
    bystander = greeted(h, "u2")
    bystander.core.send_text("b" * 900 * KB)
    live.core.send_text("l" * 300 * KB)
    h.engine.budget.user_budget = 1000 * KB
    h.engine.tick()  # 1.1 MB: the oldest kept session goes, the other stays
    assert h.hub.get(old.id) is None and h.hub.get(kept.id) is kept
    assert h.hub.get(live.id) is live and not transport.closed
    h.engine.budget.user_budget = 0
    live.core.send_text("l" * 800 * KB)
    h.engine.budget.user_budget = 1000 * KB
    h.engine.tick()  # 1.5 MB: the kept one goes, then the heaviest (the live one) closes
    assert h.hub.get(kept.id) is None
    assert h.hub.get(live.id) is None and transport.closed[-1][0] == 1009
    assert h.hub.get(bystander.id) is bystander
    budget = h.engine.budget
    assert budget.accounts["u2"].held + budget.accounts["u2"].window == held_bytes(bystander)
    assert "u1" not in budget.accounts
    with pytest.raises(UserConnectionLimit):
        budget.accounts["u2"].window = 2000 * KB
        budget.admit("u2")


def test_what_a_session_queues_downstream_counts_before_the_tick() -> None:
    """Echoes, TOOL_DONEs and the application's messages count as they are queued: the
    next admission sees them, not the tick."""
    h = Harness(maxUserBytes=1000 * KB)
    live = greeted(h, "u1")
    budget = h.engine.budget
    before = budget.accounts["u1"].window
    live.core.send_text("o" * 700 * KB)
    assert budget.accounts["u1"].window >= before + 700 * KB
    start(h, live, "t")
    out = part(h, live, "t", "x" * 400 * KB)
    assert [m["payload"]["code"] for m in out if m["type"] == "ERROR"] == ["MESSAGE_TOO_LARGE"]
    h.engine.tick()  # counted exactly again: the window and what is still unsent
    account = budget.accounts["u1"]
    assert account.held + account.window == held_bytes(live)


def test_the_servers_own_output_is_refused_past_the_users_budget() -> None:
    """A data message the application sends (here 700 kB ones) that would take its user
    past maxUserBytes is dropped and reported as OUTBOUND_QUEUE_FULL, as with a full
    pending queue: the budget holds between ticks too, control messages still go, and
    what the window evicted is taken off as it goes (so the session is not refused for
    what it no longer holds). Before, such output was counted and never refused: the
    user went past the budget until the tick closed their heaviest session."""
    h = Harness(maxUserBytes=1000 * KB, replayWindowBytes=600 * KB)
    live = greeted(h, "u1")
    budget = h.engine.budget
    big = {"type": "NOTICE", "channel": "AGENT", "payload": {"text": "o" * 700 * KB}}
    h.engine.deliver(live.id, Send(messages.from_dict(big)))
    assert [m["type"] for m in h.written(live)] == ["NOTICE"]
    assert not h.errors
    # the window (600 kB) evicts all but the newest: 700 kB held; the next one would
    # take the user to 1.4 MB
    h.engine.deliver(live.id, Send(messages.from_dict(big)))
    assert h.written(live) == []
    assert [exc.code for exc, _ in h.errors] == ["OUTBOUND_QUEUE_FULL"]
    assert "maxUserBytes" in str(h.errors[0][0])
    account = budget.accounts["u1"]
    assert account.held + account.window <= 1000 * KB
    h.send(live, "PING", {"nonce": "still"}, "SYSTEM")  # control: answered
    assert [m["type"] for m in h.written(live)] == ["PONG"]
    # once the client ACKs the window, the same message fits again
    h.send(live, "ACK", {"seq": live.core.outbound.downstream_seq}, "SYSTEM")
    h.engine.deliver(live.id, Send(messages.from_dict(big)))
    assert [m["type"] for m in h.written(live)] == ["NOTICE"]
    assert len(h.errors) == 1
    h.engine.tick()
    assert account.held + account.window == held_bytes(live) <= 1000 * KB
