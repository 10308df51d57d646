"""``CallRegistry``'s swap points for a tool call's params: ``open_charged`` (opened and
charged in one call, or ``add_call`` then ``charge_call``) and ``end_call`` (with or
without ``Meter.release`` written out). The same calls over both mean the same messages,
the same open calls and the same bytes held by the meter and its account."""

from __future__ import annotations

from typing import Any

import pytest

from protoflask.core import calls
from protoflask.core.calls import CallRegistry
from protoflask.core.errors import DuplicateCallId

from ._support import errors
from .test_meter import metered

WAYS = [("open_charged_plain", "end_call_plain"), ("open_charged_fast", "end_call_fast")]


def test_the_swap_points_take_the_fast_paths() -> None:
    assert CallRegistry.open_charged is CallRegistry.open_charged_fast
    assert CallRegistry.end_call is CallRegistry.end_call_fast


def scenario(opened: str, ended: str, monkeypatch: pytest.MonkeyPatch,
             lend: bool = False) -> Any:
    """``lend``: the account lends the meter slices (core.meter.Lender)."""
    monkeypatch.setattr(CallRegistry, "open_charged", getattr(CallRegistry, opened))
    monkeypatch.setattr(CallRegistry, "end_call", getattr(CallRegistry, ended))
    s, c = metered(200_000, lend=lend)
    seen: list[Any] = []

    def step(what: str) -> None:
        out = c.take()
        meter, account = s.meter, s.meter.account
        seen.append((what, [(m["type"], m["payload"]) for m in out], errors(out),
                     sorted((k, v.cost) for k, v in s.registry.calls.items()),
                     meter.held, getattr(account, "held", None), meter.spare, meter.cap))
        if account is not None:  # what the account counts: what the meter holds or kept
            assert account.held + account.window == meter.held + meter.window + meter.spare

    def call(call_id: str, params: Any, **extra: Any) -> None:
        c.send("TOOL_CALL", {"call_id": call_id, "tool": "echo", "params": params, **extra})

    tiny = [{}] * 2_000  # about 130 kB of objects once decoded
    call("a", {"message": "hi"})
    step("flat params")
    call("a2", {"message": "ho"})
    step("flat params again: within a slice, when lent one")
    s.work.tool_done("a2", "OK", {"echoed": "ho"})
    step("a2's given back: to the slice, when lent one")
    call("b", {"l": tiny})
    step("nested params")
    call("c", {"l": tiny})
    step("over budget: MAX_RUNS_EXCEEDED, its TOOL_DONE")
    call("d", {"message": "x"}, run_id="nope")
    step("no such run")
    with pytest.raises(DuplicateCallId):
        s.registry.open_charged("a", None, None, {})
    step("a duplicate: nothing changed")
    s.work.tool_done("b", "OK", {"echoed": "x"})
    step("b's params given back")
    s.work.tool_done("b", "OK", {"echoed": "x"})
    step("b again: nothing")
    call("e", {"l": tiny})
    step("room again")
    s.meter.account = None  # a meter without account only counts
    call("f", {"message": "no account"})
    s.work.tool_done("f", "OK", {"echoed": "x"})
    s.work.tool_done("a", "OK", {"echoed": "x"})
    step("without an account")
    for call_id in ("e",):
        s.work.tool_done(call_id, "OK", {})
    seen.append(("the end", s.meter.held))
    return seen


@pytest.mark.parametrize("lend", [False, True])
@pytest.mark.parametrize("opened, ended", WAYS)
def test_means_what_the_plain_path_means(opened: str, ended: str, lend: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen = scenario(opened, ended, monkeypatch, lend)
    monkeypatch.undo()
    plain = scenario(*WAYS[0], monkeypatch, lend)
    assert seen == plain
    assert seen[-1] == ("the end", 0)
    assert any(spare for *_, spare, _cap in seen[:-1]) == lend  # a slice was charged
    assert calls.memory_of({"message": "hi"}) in [cost for _, cost in seen[0][3]]
