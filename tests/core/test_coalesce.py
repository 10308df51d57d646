"""TextCoalescer: tokens in, parts out, by a time and a size budget (no clock, no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from protoflask.core.coalesce import TextCoalescer


def test_a_fast_model_is_coalesced_by_time() -> None:
    c = TextCoalescer(now=0, max_chars=1000, max_delay_ms=50)
    assert c.push("a", 10) == [] and c.push("b", 49) == []
    assert c.push("c", 50) == ["abc"]          # 50 ms after the START
    assert c.push("d", 60) == [] and c.push("e", 99) == []
    assert c.push("f", 100) == ["def"]         # 50 ms after the last part
    assert c.push("g", 101) == [] and c.flush() == "g" and c.flush() == ""


def test_a_slow_model_goes_out_token_by_token() -> None:
    c = TextCoalescer(now=0, max_chars=1000, max_delay_ms=50)
    assert [c.push(t, at) for t, at in (("x", 60), ("y", 200), ("z", 400))] == [
        ["x"], ["y"], ["z"]]


def test_size_budget_cuts_parts_of_exactly_max_chars() -> None:
    c = TextCoalescer(now=0, max_chars=4, max_delay_ms=10_000)
    assert c.push("ab", 1) == []
    assert c.push("cdefghij", 2) == ["abcd", "efgh"]
    assert c.waiting == 2
    assert c.push("", 3) == []                 # empty chunks cost nothing
    assert c.flush() == "ij"


def test_drop_forgets_the_tail() -> None:
    c = TextCoalescer(now=0, max_chars=100, max_delay_ms=100)
    c.push("abc", 1)
    assert c.drop() == 3 and c.flush() == ""


def test_budgets_are_validated() -> None:
    with pytest.raises(ValueError):
        TextCoalescer(now=0, max_chars=0)
    with pytest.raises(ValueError):
        TextCoalescer(now=0, max_delay_ms=-1)


@given(st.lists(st.tuples(st.text(max_size=30), st.integers(0, 40))), st.integers(1, 16),
       st.integers(0, 60))
def test_nothing_is_lost_reordered_or_oversized(tokens, max_chars, max_delay) -> None:
    c = TextCoalescer(now=0, max_chars=max_chars, max_delay_ms=max_delay)
    now, parts = 0, []
    for text, gap in tokens:
        now += gap
        parts += c.push(text, now)
    tail = c.flush()
    parts += [tail] if tail else []
    assert "".join(parts) == "".join(t for t, _ in tokens)
    assert all(0 < len(p) <= max_chars for p in parts)
