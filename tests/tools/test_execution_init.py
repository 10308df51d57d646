"""``ToolExecution``'s hand-written ``__init__`` (its ``start_time`` read without a frame
of ``now_ms``) against the dataclass's own, made from the same fields: the same record
for the same arguments, positional or named, a clock reading when no ``start_time`` is
given."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from protoflask.tools import ToolExecution

#: the dataclass's generated __init__ over ToolExecution's fields (the definition)
Plain = dataclasses.make_dataclass(
    "Plain", [(f.name, f.type, dataclasses.field(
        default=f.default, default_factory=f.default_factory, repr=f.repr, compare=f.compare))
        for f in dataclasses.fields(ToolExecution)], slots=True)

NAMES = [f.name for f in dataclasses.fields(ToolExecution)]


def done(execution: Any, error: Any) -> None:
    pass


CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("c1", "echo", {"message": "hi"}), {}),
    (("c2", "add", [1, 2]), {"run_id": "r1"}),
    (("c3", "echo", None, "running", 12, 34, {"x": 1}, 0.5, "part", "r2", done, 1.5), {}),
    (("c4", "echo"), {"arguments": 7, "status": "completed", "start_time": 0, "end_time": 9,
                      "result": [1], "progress": 1.0, "partial": {}, "on_done": done,
                      "run_started": 2.0}),
]


def values(record: Any) -> list[Any]:
    return [getattr(record, name) for name in NAMES]


@pytest.mark.parametrize("args, kwargs", CASES)
def test_the_same_record_as_the_dataclass_init(args: tuple[Any, ...], kwargs: dict[str, Any]
                                                ) -> None:
    before = time.time_ns() // 1_000_000
    fast, plain = ToolExecution(*args, **kwargs), Plain(*args, **kwargs)
    after = time.time_ns() // 1_000_000
    mine, theirs = values(fast), values(plain)
    at = NAMES.index("start_time")
    if "start_time" not in kwargs and len(args) <= at:
        assert before <= mine[at] <= after and before <= theirs[at] <= after
        mine[at] = theirs[at] = None
    assert mine == theirs


def test_the_clock_is_read_each_time() -> None:
    first = ToolExecution("a", "echo", {})
    time.sleep(0.003)
    assert ToolExecution("b", "echo", {}).start_time > first.start_time


def test_equality_and_replace_keep_working() -> None:
    one = ToolExecution("a", "echo", {"m": 1}, start_time=5)
    assert one == ToolExecution("a", "echo", {"m": 1}, start_time=5, on_done=done)
    assert dataclasses.replace(one, status="completed").status == "completed"
    with pytest.raises(TypeError):
        ToolExecution("a", "echo")  # type: ignore[call-arg]
