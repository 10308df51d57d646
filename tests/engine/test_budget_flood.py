"""A refusal flood (the budget attacks' kind, at the engine): one user at their own
maxUserBytes, or the worker at its memoryCeiling, sends refused tool calls in a loop
while another user keeps a slice lent (``budget.SLICE``) and many idle sessions sit on
the worker. Taking slices back before a refusal (``Account.settle``) visits the lent
meters only, not the sessions: the server's work per refused call (Python lines run in
protoflask, counted with ``sys.settrace``: deterministic, not a timing) is the same with
20 sessions and with 1,000."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import protoflask

from .test_engine import Harness
from .test_budget_slices import echo, greeted, told

MIB = 1 << 20
PACKAGE = str(Path(protoflask.__file__).parent)


def lines_run(work: Any) -> int:
    """How many lines of protoflask's code ``work()`` runs."""
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def refused(h: Harness, live: Any, call_id: str, out: list[dict[str, Any]]) -> None:
    out.extend(echo(h, live, call_id))


def refused_call_cost(idle: int, why: str) -> int:
    """Lines run by one refused call of the flooder, the flood under way (the worst of
    five, each after the lender's echo)."""
    config = {"maxUserBytes": 8 * MIB, "memoryCeiling": 0} if why == "maxUserBytes" \
        else {"maxUserBytes": 0, "memoryCeiling": 64 * MIB}
    h = Harness(echoMessages=False, **config)
    budget = h.engine.budget
    for i in range(idle):
        h.connect(f"idle{i % 50}")
    lender, flooder = greeted(h, "lender"), greeted(h, "flooder")
    echo(h, lender, "warm")
    echo(h, flooder, "warm")
    assert budget.lent == {lender.core.meter, flooder.core.meter}
    spares = sum(meter.spare for meter in budget.lent)
    room = 8 * MIB - told(h, "flooder") + flooder.core.meter.spare \
        if why == "maxUserBytes" else 64 * MIB - budget.total + spares
    flooder.core.meter.charge(room - 100)  # at the limit, slices aside
    costs = []
    for i in range(8):
        echo(h, lender, f"l{i}")  # (lends again when a refusal took its slice back)
        out: list[dict[str, Any]] = []
        costs.append(lines_run(partial(refused, h, flooder, f"f{i}", out)))
        errors = [m["payload"] for m in out if m["type"] == "ERROR"]
        assert [e["code"] for e in errors] == ["MAX_RUNS_EXCEEDED"], out
        assert why in errors[0]["message"]
    if why == "maxUserBytes":  # the lender's slice, never in the flooder's way, stays
        assert lender.core.meter in budget.lent
    else:  # all taken back by the first refusal, and none lent again: the worker is
        assert not budget.lent  # past LEND_UNDER of its ceiling
    return max(costs[3:])


@pytest.mark.parametrize("why", ["maxUserBytes", "memoryCeiling"])
def test_a_refused_call_costs_the_same_whatever_the_sessions(why: str) -> None:
    few, many = refused_call_cost(20, why), refused_call_cost(1000, why)
    assert many <= few + 20, (few, many)  # (the old walk: ~5 lines more a session)
