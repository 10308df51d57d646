"""The memory budget's slices (budget.py SLICE, core.meter.Lender): a session's meter
charges its calls and queued messages against a slice its user's account lent, without a
call per change, and the budget still holds exactly: the counts never fall below what the
sessions hold, nobody is refused for a slice another session kept aside (taken back
first: ``MemoryBudget.settle``), the review and a session's end take slices back, and a
small budget lends none (every change told, as before slices)."""

from __future__ import annotations

from sys import getsizeof
from typing import Any

from protoflask.budget import CAP, SLICE

from .test_engine import Harness

MIB = 1 << 20


def greeted(h: Harness, user: str) -> Any:
    live, _ = h.connect(user)
    h.hello(live)
    h.written(live)
    return live


def echo(h: Harness, live: Any, call_id: str) -> list[dict[str, Any]]:
    h.send(live, "TOOL_CALL", {"call_id": call_id, "tool": "echo",
                               "params": {"message": "hello " * 20}}, "AGENT")
    return h.written(live)


def told(h: Harness, user: str) -> int:
    """What the user's meters hold or were lent, as the account must count it."""
    return sum(s.core.meter.held + s.core.meter.window + s.core.meter.spare
               for s in h.hub.sessions() if s.user_id == user)


def test_calls_are_charged_in_a_slice_and_the_count_stays_exact() -> None:
    h = Harness(maxUserBytes=64 * MIB)
    live = greeted(h, "u1")
    account = h.engine.budget.accounts["u1"]
    for i in range(50):
        out = echo(h, live, f"c{i}")
        assert [m["payload"]["status"] for m in out if m["type"] == "TOOL_DONE"] == ["OK"]
        assert account.held + account.window == told(h, "u1")
    meter = live.core.meter
    assert meter.cap == CAP and 0 < meter.spare <= CAP  # lent, and charged against
    assert account.lenders == 1 == h.engine.budget.lenders
    assert meter.held == 0  # every call's params given back
    h.engine.budget.review(h.hub.sessions())  # the tick's review takes slices back
    assert meter.spare == meter.cap == 0 and h.engine.budget.lenders == 0
    assert account.held == 0 and account.held + account.window == told(h, "u1")


def test_nobody_is_refused_for_a_slice_another_session_holds() -> None:
    """8 MiB lends two slices (LENT_SHARE): two sessions hold them; a third session,
    filled near the budget, is sent a text part that fits what the sessions hold, though
    not with the slices counted: it is taken, the slices taken back first; a part past
    the exact count is refused."""
    budget_bytes = 8 * MIB
    h = Harness(maxUserBytes=budget_bytes, echoMessages=False)
    budget = h.engine.budget
    first, second, third = greeted(h, "u1"), greeted(h, "u1"), greeted(h, "u1")
    echo(h, first, "a")
    echo(h, second, "b")
    assert first.core.meter.spare > 0 and second.core.meter.spare > 0
    assert budget.lenders == 2
    h.send(third, "MESSAGE_START", {"message_id": "t", "content_type": "text/plain"}, "USER")
    h.written(third)
    account = budget.accounts["u1"]
    spares = told(h, "u1") - sum(s.core.meter.held + s.core.meter.window
                                 for s in h.hub.sessions())
    assert spares >= SLICE
    text = "x" * 500_000
    # what the sessions hold, filled to 4 kB short of the budget with the part
    fill = budget_bytes - (told(h, "u1") - spares) - getsizeof(text) - 4096
    third.core.meter.charge(fill)  # (held as if by the session's texts)
    assert budget.lenders == 2
    assert account.held + account.window + getsizeof(text) > budget_bytes
    h.send(third, "MESSAGE_PART", {"message_id": "t", "content": text}, "USER")
    assert [m for m in h.written(third) if m["type"] == "ERROR"] == []
    assert budget.lenders == 0 and first.core.meter.spare == second.core.meter.spare == 0
    assert account.held + account.window == told(h, "u1") <= budget_bytes
    h.send(third, "MESSAGE_PART", {"message_id": "t", "content": "y" * 8192}, "USER")
    assert [m["payload"]["code"] for m in h.written(third) if m["type"] == "ERROR"] == \
        ["MESSAGE_TOO_LARGE"]


def test_a_sessions_end_gives_its_slice_back() -> None:
    h = Harness(maxUserBytes=64 * MIB)
    live, other = greeted(h, "u1"), greeted(h, "u1")
    echo(h, live, "a")
    budget = h.engine.budget
    assert live.core.meter.spare > 0 and budget.lenders == 1
    budget.drop(live, "the test ends it")  # the engine's end of a session (as the review's)
    account = budget.accounts["u1"]
    assert h.hub.get(live.id) is None
    assert budget.lenders == 0 == account.lenders
    assert account.held + account.window == told(h, "u1") == \
        other.core.meter.held + other.core.meter.window


def test_a_small_budget_lends_nothing() -> None:
    """Under 32 * CAP (4 MiB) no slice: every charge and release is told at once."""
    h = Harness(maxUserBytes=3 * MIB)
    live = greeted(h, "u1")
    echo(h, live, "a")
    assert live.core.meter.spare == live.core.meter.cap == 0
    assert h.engine.budget.lenders == 0
