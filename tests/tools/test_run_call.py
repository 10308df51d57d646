"""``Dispatcher.run_call``'s swap point: a client's tool call started on the session's
runner and its reports applied through ``settle_calls``' loop (``run_call_pulled``), or an
inline tool's one report applied as the runner returns it (``run_call_fast``). The same
calls over both mean the same messages, signals, errors, counts and budget."""

from __future__ import annotations

import json
from typing import Any

import gevent
import pytest

from protoflask import signals
from protoflask.dispatch import Dispatcher
from protoflask.tool_runner import Report
from protoflask.tools import Tool
from tests.engine.test_engine import Harness


def _raises(params: Any, *_: Any) -> Any:
    raise RuntimeError("the tool broke")


def _wrong_result(params: Any, *_: Any) -> Any:
    return {"echoed": 5}  # echo's outputSchema wants a string


def _slow(params: Any, *_: Any) -> Any:
    gevent.sleep(0.001)
    return {"echoed": "late"}


class Listening(Harness):
    """A harness whose ``toolCall`` listener waits for every call's end (``on_done``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, str, str]] = []

    def emit(self, signal: Any, **kwargs: Any) -> None:
        super().emit(signal, **kwargs)
        if signal is signals.tool_call:
            kwargs["execution"].on_done = self.done

    def done(self, execution: Any, error: Any) -> None:
        self.ended.append((execution.call_id, execution.status, repr(error)))


def run(how: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(Dispatcher, "run_call", getattr(Dispatcher, how))
    h = Listening()
    schema = h.tools.get("echo")
    assert schema is not None
    for name, fn, inline in (("raises", _raises, True), ("wrong", _wrong_result, True),
                             ("slow", _slow, False)):
        h.tools.register(Tool(name, "", schema.input_schema, schema.output_schema, fn,
                              inline=inline))
    live, transport = h.connect()
    h.hello(live)
    h.written(live)
    h.signals.clear()

    def call(call_id: str, tool: str, params: Any) -> None:
        h.send(live, "TOOL_CALL", {"call_id": call_id, "tool": tool, "params": params}, "USER")

    call("a", "echo", {"message": "hi"})
    call("b", "raises", {"message": "hi"})
    call("c", "wrong", {"message": "hi"})
    call("d", "echo", {"nope": 1})  # refused before it runs
    call("e", "add", {"a": 1, "b": 2})
    call("f", "slow", {"message": "hi"})  # not inline: its own greenlet, its bell
    call("g", "echo", {"message": "while f runs"})
    gevent.sleep(0.02)
    # a report waiting when an inline call ends (its ring not answered yet): in turn
    h.engine.tool_runner(live).reports.append(Report("update", "h", "QUEUED"))
    call("h", "echo", {"message": "after"})
    gevent.sleep(0)
    runner = h.engine.tool_runner(live)
    # the fast path keeps the session's Work on the runner: it must be the core's own
    assert runner.work is (live.core.work if how == "run_call_fast" else None)
    written = [{k: v for k, v in m.items() if k not in ("id", "ts", "session")}
               for m in h.written(live)]
    signals = [(s.name, {k: v for k, v in kw.items() if k != "execution"})
               for s, kw in h.signals]
    executions = [(kw["execution"].call_id, kw["execution"].status, kw["execution"].result)
                  for s, kw in h.signals if "execution" in kw]
    errors = [(type(e).__name__, str(e)) for e, _ in h.errors]
    stats = h.engine.stats
    text = json.dumps([written, signals, executions, errors, sorted(stats.tools.calls.items()),
                       stats.tools.running, stats.tools.queued, runner.reports,
                       runner.executions, runner.pulling, live.core.meter.held,
                       sorted(live.core.work.registry.calls), h.ended, transport.wakes],
                      default=repr)
    return json.loads(text.replace(live.id, "<sid>"))


@pytest.mark.parametrize("how", ["run_call_pulled", "run_call_fast"])
def test_means_what_the_pulled_path_means(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run(how, monkeypatch)
    monkeypatch.undo()
    assert seen == run("run_call_pulled", monkeypatch)
    written = seen[0]
    done = {m["payload"]["call_id"]: m["payload"]["status"] for m in written
            if m["type"] == "TOOL_DONE"}
    assert done == {"a": "OK", "b": "ERROR", "c": "ERROR", "d": "ERROR", "e": "OK",
                    "f": "OK", "g": "OK", "h": "OK"}


def test_the_fast_one_is_in_use() -> None:
    assert Dispatcher.run_call is Dispatcher.run_call_fast
