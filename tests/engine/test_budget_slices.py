"""The memory budget's slices (budget.py SLICE, core.meter.Lender): a session's meter
charges its calls and queued messages against a slice its user's account lent, without a
call per change, and the budget still holds exactly: the counts never fall below what the
sessions hold, nobody is refused for a slice another session kept aside (taken back
first: ``MemoryBudget.settle``), the review and a session's end take slices back, and a
small budget lends none (every change told, as before slices)."""

from __future__ import annotations

import gc
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


def test_a_user_budget_refusal_takes_back_only_that_users_slices() -> None:
    """u2, at their own maxUserBytes, is refused a call: their slice is taken back (it
    could have let the call in), u1's stays lent (it never counted against u2)."""
    h = Harness(maxUserBytes=8 * MIB, echoMessages=False)
    budget = h.engine.budget
    mine, theirs = greeted(h, "u1"), greeted(h, "u2")
    echo(h, mine, "a")
    echo(h, theirs, "b")
    assert mine.core.meter.spare > 0 and theirs.core.meter.spare > 0
    u1, u2 = budget.accounts["u1"], budget.accounts["u2"]
    assert u1.lent == {mine.core.meter} and u2.lent == {theirs.core.meter}
    # u2's sessions hold 100 bytes short of the budget: the call does not fit
    theirs.core.meter.charge(8 * MIB - (told(h, "u2") - theirs.core.meter.spare) - 100)
    out = echo(h, theirs, "c")
    assert [m["payload"]["code"] for m in out if m["type"] == "ERROR"] == \
        ["MAX_RUNS_EXCEEDED"]
    assert theirs.core.meter.spare == theirs.core.meter.cap == 0 and not u2.lent
    assert mine.core.meter.cap == CAP and mine.core.meter.spare > 0
    assert budget.lent == u1.lent == {mine.core.meter}
    for user, account in (("u1", u1), ("u2", u2)):
        assert account.held + account.window == told(h, user)


def test_a_ceiling_refusal_takes_back_everyones_slices_unless_none_could_help() -> None:
    h = Harness(memoryCeiling=64 * MIB, maxUserBytes=0, echoMessages=False)
    budget = h.engine.budget
    lenders = [greeted(h, f"u{i}") for i in range(3)]
    for i, live in enumerate(lenders):
        echo(h, live, f"c{i}")
    assert len(budget.lent) == 3
    big = greeted(h, "big")
    # a charge past the ceiling by more than every slice could give back: refused as it
    # is, the slices left lent
    hopeless = 64 * MIB - budget.total + 3 * CAP + 1
    try:
        big.core.meter.charge(hopeless)
        raise AssertionError("not refused")
    except Exception as exc:  # OverBudget
        assert "memoryCeiling" in str(exc)
    assert len(budget.lent) == 3
    # one the slices are in the way of: taken back, every user's, and let in
    big.core.meter.charge(64 * MIB - (budget.total - sum(
        s.core.meter.spare for s in lenders)) - 1024)
    assert not budget.lent and all(s.core.meter.spare == 0 for s in lenders)
    assert budget.total == sum(told(h, u) for u in ("u0", "u1", "u2", "big")) <= 64 * MIB


def test_a_refused_data_message_counts_the_windows_change_once() -> None:
    """``Account.queued`` refusing with slices lent: the window's change since the last
    message is counted once, whether the message is then let in (8 kB: the slice was in
    its way) or not (128 kB)."""
    for nbytes, let_in in ((8192, True), (128 << 10, False)):
        h = Harness(maxUserBytes=8 * MIB, echoMessages=False)
        budget = h.engine.budget
        first, third = greeted(h, "u1"), greeted(h, "u1")
        echo(h, first, "a")
        assert budget.lent == {first.core.meter}
        account = budget.accounts["u1"]
        meter = third.core.meter
        meter.charge(8 * MIB - told(h, "u1") - 2048)
        assert account.held + account.window == told(h, "u1")
        # the window shrank by 1000 (evictions) since
        assert (meter.queue(meter.window - 1000, nbytes, True) is None) is let_in
        assert not budget.lent and account.held + account.window == told(h, "u1")


def test_a_gone_sessions_meter_leaves_the_lenders_and_nothing_of_the_budget_holds_it() -> None:
    h = Harness(maxUserBytes=64 * MIB)
    budget = h.engine.budget
    dropped, vanished, other = greeted(h, "u1"), greeted(h, "u1"), greeted(h, "u2")
    for i, live in enumerate((dropped, vanished, other)):
        echo(h, live, f"c{i}")
    assert len(budget.lent) == 3
    meters = [dropped.core.meter, vanished.core.meter]
    u1 = budget.accounts["u1"]
    budget.drop(dropped, "the test ends it")  # forgotten: out of the lenders at once
    assert len(budget.lent) == 2 and len(u1.lent) == 1
    h.hub.remove(vanished.id)  # gone without a forget: the review takes its slice back
    budget.review(h.hub.sessions())
    assert not budget.lent and not u1.lent and "u1" not in budget.accounts
    assert vanished.core.meter.cap == vanished.core.meter.spare == 0
    for meter in meters:  # held by its session only: nothing of the budget's keeps it
        assert [type(r) for r in gc.get_referrers(meter) if type(r) in (set, dict, list)
                and r is not meters] == []
