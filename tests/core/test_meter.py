"""What a session's client makes it hold, metered as it is admitted (issue 24): open
texts' parts, tool calls' params (until their TOOL_DONE, queued ones included) and
runs' metadata, by what they cost in memory; a charge an account refuses is the
contract's error for what was refused, never a silent drop."""

from __future__ import annotations

from sys import getsizeof

import orjson

from collections import OrderedDict

from protoflask.core import meter
from protoflask.core.meter import (
    FLAT_KEYS, JSON_FACTOR, WALK_LIMIT, Meter, OverBudget, memory_of, memory_of_flat,
    memory_of_walk,
)

from ._support import Client, errors, make_session, types


class Limit:
    """An account that holds at most ``budget`` bytes (the user's, in budget.py)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held, self.window = budget, 0, 0

    def take(self, nbytes: int) -> None:
        if self.held + nbytes > self.budget:
            raise OverBudget(f"over {self.budget}")
        self.held += nbytes

    def give(self, nbytes: int) -> None:
        self.held -= nbytes

    def queued(self, change: int, nbytes: int, refusable: bool) -> str | None:
        self.window += change
        if refusable and self.held + self.window + nbytes > self.budget:
            return f"over {self.budget}"
        self.window += nbytes
        return None


class Lend(Limit):
    """A ``Limit`` that lends a meter ``slice`` bytes while it stays under half its
    budget (``core.meter.Lender``: budget.py's Account in small, without the taking back
    of slices lent to other meters)."""

    def __init__(self, budget: int, slice: int = 500) -> None:
        super().__init__(budget)
        self.slice = slice

    def lend(self, meter: Meter, nbytes: int) -> None:
        more = nbytes - meter.spare
        if self.held + self.window + more > self.budget:
            raise OverBudget(f"over {self.budget}")
        if self.held + self.window + more + self.slice <= self.budget // 2:
            more += self.slice
            meter.spare, meter.cap = self.slice, 2 * self.slice
        else:
            meter.spare = 0
        self.held += more

    def repay(self, meter: Meter, keep: int) -> None:
        back = meter.spare - keep
        if back > 0:
            meter.spare = keep
            self.held -= back


def metered(budget: int, lend: bool = False, **settings):
    s = make_session(**settings)
    s.meter.account = Lend(budget) if lend else Limit(budget)
    c = Client(s)
    c.handshake()
    c.take()
    return s, c


def test_memory_of_counts_objects_not_utf8_bytes():
    tiny = orjson.loads(b"[" + b",".join([b"{}"] * 10_000) + b"]")
    assert memory_of(tiny) >= 10_000 * getsizeof({})  # 3 bytes of JSON, 64 of memory
    emoji = "\U0001F600" + "x" * 1000
    assert memory_of({"m": emoji}) >= 4 * 1001  # 1004 bytes of UTF-8
    assert memory_of(None) == getsizeof(None)


def test_the_flat_count_is_the_walk_over_every_shape():
    """The swap point (``meter.memory_of``) and both sides of it: the same number for
    flat dicts (the fast pass), and for every value it hands to the walk."""
    assert memory_of is meter.memory_of_flat
    emoji = "\U0001F600" * 3
    values = [
        {"message": "hello from the bench"}, {}, {"a": 1, "b": 2.5, "c": None, "d": True},
        {"m": emoji, "": "", "n": -(10 ** 30)}, {"k": (1, 2, 3)}, {"o": OrderedDict(a=[1])},
        {"nested": {"a": 1}}, {"list": [1, "x", {"y": [2]}]}, {"a": 1, "z": []},
        {str(i): i for i in range(FLAT_KEYS)}, {str(i): "v" * i for i in range(FLAT_KEYS + 1)},
        OrderedDict(a=1), [1, 2, {"a": "b"}], "text", 7, None, 3.5, [],
        {str(i): {} for i in range(WALK_LIMIT + 1)},  # beyond the walk: the JSON bound
        orjson.loads(b'{"a":{"b":[1,2,{"c":"d"}]},"e":"' + b"x" * 500 + b'"}'),
        # strings of every kind, as keys and values (ASCII ones are counted without
        # getsizeof): Latin-1, two- and four-byte characters, a str subclass, non-str keys
        {"caf\u00e9": "na\u00efve", "\u4e2d": "\u6587" * 7, "\U0001F600": "x" * 3000},
        {"k": Text("subclassed"), 1: "one", None: "", (1, 2): "a tuple key"},
        orjson.loads('{"\u00e9t\u00e9": "\u00e0 la", "ascii": "\u4e2d\u6587"}'.encode()),
    ]
    for value in values:
        walked = memory_of_walk(value)
        assert memory_of_flat(value) == walked, value
        assert memory_of(value) == walked
    flat = {"a": "x" * 100, "b": 12345}
    assert memory_of_flat(flat) == getsizeof(flat) + getsizeof("a") + getsizeof("b") + \
        getsizeof("x" * 100) + getsizeof(12345)


class Text(str):
    """A str subclass: counted by getsizeof (its object is larger than a str's)."""


def test_a_value_of_many_objects_is_bounded_from_its_json_without_a_walk():
    """330,000 ``{}``: one encoding instead of a walk of every object, and a bound."""
    huge = orjson.loads(b"[" + b",".join([b"{}"] * 330_000) + b"]")
    assert memory_of(huge) == JSON_FACTOR * (330_000 * 3 + 1) >= 330_000 * getsizeof({})
    small = [{}] * (WALK_LIMIT - 1)
    assert memory_of(small) == getsizeof(small) + (WALK_LIMIT - 1) * getsizeof({})
    deep: dict = {}
    for _ in range(200):  # the densest JSON this bound must cover
        deep = {"": deep}
    assert memory_of(deep) <= JSON_FACTOR * len(orjson.dumps(deep))


def test_a_text_part_is_charged_by_its_memory_and_given_back_at_its_end():
    s, c = metered(1 << 20)
    c.send("MESSAGE_START", {"message_id": "t", "content_type": "text/plain"})
    part = "\U0001F600" + "x" * 10_000
    c.send("MESSAGE_PART", {"message_id": "t", "content": part})
    assert s.meter.held == getsizeof(part) > 40_000
    assert s.meter.account.held == s.meter.held
    c.send("MESSAGE_END", {"message_id": "t"})
    assert s.meter.held == 0 and s.meter.account.held == 0


def test_a_text_part_over_budget_discards_the_text_with_message_too_large():
    s, c = metered(100_000)
    c.send("MESSAGE_START", {"message_id": "t", "content_type": "text/plain"})
    c.send("MESSAGE_PART", {"message_id": "t", "content": "\U0001F600" + "x" * 20_000})
    assert errors(c.take()) == []  # 80 kB held
    c.send("MESSAGE_PART", {"message_id": "t", "content": "\U0001F600" + "x" * 20_000})
    out = c.take()
    assert errors(out) == ["MESSAGE_TOO_LARGE"] and "discarded" in out[-1]["payload"]["message"]
    assert "t" not in s.texts and s.meter.held == 0 and s.meter.account.held == 0


def test_tool_call_params_are_held_until_the_tool_done():
    s, c = metered(1 << 20)
    params = {"message": "\U0001F600" * 20_000}
    c.send("TOOL_CALL", {"call_id": "a", "tool": "echo", "params": params})
    assert s.meter.held == memory_of(params) > 80_000
    s.work.tool_done("a", "OK", {"echoed": "x"})
    assert s.meter.held == 0 and s.meter.account.held == 0


def test_a_tool_call_over_budget_gets_its_one_tool_done_max_runs_exceeded():
    s, c = metered(200_000)
    tiny = [{}] * 2_000  # 6 kB of JSON, about 130 kB of objects once decoded
    c.send("TOOL_CALL", {"call_id": "a", "tool": "echo", "params": {"l": tiny}})
    c.send("TOOL_CALL", {"call_id": "b", "tool": "echo", "params": {"l": tiny}})
    out = c.take()
    assert errors(out) == ["MAX_RUNS_EXCEEDED"]
    done = [m for m in out if m["type"] == "TOOL_DONE"]
    assert [(m["payload"]["call_id"], m["payload"]["status"]) for m in done] == [("b", "ERROR")]
    assert set(s.registry.calls) == {"a"}
    s.work.tool_done("a", "OK", {})
    c.send("TOOL_CALL", {"call_id": "c", "tool": "echo", "params": {"l": tiny}})
    assert errors(c.take()) == []  # room again once a's params were given back


def test_an_application_call_over_budget_is_refused_before_anything_is_sent():
    s, c = metered(10_000)
    try:
        s.work.open_call("app", None, {"m": "x" * 20_000})
    except Exception as exc:
        assert getattr(exc, "code", None) == "MAX_RUNS_EXCEEDED"
    else:
        raise AssertionError("an application call over budget was let in")
    assert "app" not in s.registry.calls and s.meter.held == 0
    assert c.take() == []


def test_run_metadata_is_charged_while_the_run_is_active():
    s, c = metered(100_000)
    c.send("RUN_STARTED", {"run_id": "r1", "metadata": {"m": "x" * 60_000}})
    assert types(c.take()) == ["RUN_STARTED"] and s.meter.held > 60_000
    c.send("RUN_STARTED", {"run_id": "r2", "metadata": {"m": "x" * 60_000}})
    out = c.take()
    assert errors(out) == ["MAX_RUNS_EXCEEDED"] and "r2" not in s.runs
    c.send("RUN_FINISHED", {"run_id": "r1"})
    c.take()
    assert s.meter.held == 0 and s.meter.account.held == 0


def test_a_meter_without_account_only_counts():
    meter = Meter()
    meter.charge(10)
    meter.release(4)
    assert meter.held == 6
