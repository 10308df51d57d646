"""SessionToolRunner on its own: a recording puller, real tools, no session, no server."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import pytest

from protoflask.core.errors import MaxRunsExceeded, ToolExecutionError
from protoflask.bell import Bell
from protoflask.tool_runner import CallSink, SessionToolRunner
from protoflask.tools import Tool, ToolExecution

OBJECT = {"type": "object"}


class Recorder:
    """The layer above the runner, reduced to a record: it pulls the runner's reports
    (when the bell rings, and whenever ``calls`` is read) as ("update"|"done"|"fail"|
    "failed", ...), in order, and tells each execution's on_done as the engine does."""

    def __init__(self) -> None:
        self._calls: list[tuple[Any, ...]] = []
        self.runner: SessionToolRunner | None = None
        self.rings = 0

    def sink(self, session_id: str = "s1") -> CallSink:
        return CallSink(session_id, "the-server", Bell(self.rung))

    def rung(self) -> None:
        self.rings += 1
        self.pull()

    def pull(self) -> None:
        assert self.runner is not None
        for r in self.runner.take_reports():
            if r.kind == "update":
                self._calls.append(("update", r.call_id, r.status))
            elif r.kind == "done":
                self._calls.append(("done", r.call_id, r.status, r.result))
            else:
                self._calls.append(("fail", r.call_id, r.error))
            if r.execution is not None and r.execution.on_done is not None:
                r.execution.on_done(r.execution, r.error)
            if r.raised is not None:
                self._calls.append(("failed", r.raised, "s1"))

    @property
    def calls(self) -> list[tuple[Any, ...]]:
        self.pull()
        return self._calls


def runner(rec: Recorder, limit: int = 2, queue_size: int = 1, timeout_ms: int = 5000,
           finished: list[ToolExecution] | None = None) -> SessionToolRunner:
    rec.runner = SessionToolRunner(rec.sink(), limit, queue_size, timeout_ms,
                                   on_finish=None if finished is None else finished.append)
    return rec.runner


def blocking_tool(name: str, release: gevent.event.Event, **kw: Any) -> Tool:
    def execute(params: Any, session_id: str, call_id: str, server: Any) -> dict[str, Any]:
        release.wait()
        return {"server": server}
    return Tool(name, "waits", OBJECT, execute=execute, **kw)


def test_an_inline_tool_is_called_with_the_context_and_reported_at_once() -> None:
    rec, finished = Recorder(), []
    seen: list[tuple[Any, ...]] = []
    echo = Tool("echo", "echoes", OBJECT, inline=True,
                execute=lambda p, sid, cid, server: seen.append((p, sid, cid, server)) or p)
    run = runner(rec, finished=finished)
    run.submit(ToolExecution("c1", "echo", {"message": "hi"}), echo)
    assert seen == [({"message": "hi"}, "s1", "c1", "the-server")]  # the opaque context
    assert run.reports and rec.rings == 0  # reported and rung: nothing called up
    assert rec.calls == [("done", "c1", "OK", {"message": "hi"})]
    assert [(e.call_id, e.status) for e in finished] == [("c1", "completed")]
    assert run.executions == {} and run.running == {}


@pytest.mark.parametrize("pulled", [False, True])
def test_a_caller_that_pulls_at_once_is_not_rung_for_it(pulled: bool) -> None:
    """``pulled``: the session layer takes the reports of its own submit or cancel as it
    returns, so what they reported rings no bell (a ring spawned a greenlet per inline
    call, to find nothing left); a report made later, by a running call, still rings."""
    rec = Recorder()
    release = gevent.event.Event()
    echo = Tool("echo", "echoes", OBJECT, inline=True, execute=lambda p, *_: p)
    run = runner(rec, limit=1, queue_size=1)
    run.submit(ToolExecution("c1", "echo", {"n": 1}), echo, pulled=pulled)  # done at once
    run.submit(ToolExecution("c2", "slow", {}), blocking_tool("slow", release), pulled=pulled)
    run.submit(ToolExecution("c3", "slow", {}), blocking_tool("slow", release), pulled=pulled)
    run.cancel("c3", pulled=pulled)  # the queued one: its QUEUED and CANCELLED reports
    gevent.sleep(0.01)
    assert rec.rings == (0 if pulled else 3)
    assert [c[:3] for c in rec.calls] == [("done", "c1", "OK"), ("update", "c3", "QUEUED"),
                                          ("done", "c3", "CANCELLED")]
    release.set()
    gevent.sleep(0.01)
    assert rec.rings == (1 if pulled else 4)  # c2's end, from its own greenlet
    assert rec.calls[-1][:3] == ("done", "c2", "OK")


def test_calls_beyond_the_limit_queue_then_are_refused() -> None:
    rec = Recorder()
    release = gevent.event.Event()
    tool = blocking_tool("slow", release)
    run = runner(rec, limit=1, queue_size=1)
    for call_id in ("c1", "c2", "c3"):
        run.submit(ToolExecution(call_id, "slow", {}), tool)
    assert list(run.running) == ["c1"] and [w[0].call_id for w in run.waiting] == ["c2"]
    assert rec.calls[0] == ("update", "c2", "QUEUED")
    kind, call_id, error = rec.calls[1]
    assert (kind, call_id) == ("fail", "c3") and isinstance(error, MaxRunsExceeded)
    release.set()
    gevent.sleep(0.01)
    assert rec.calls[2:] == [("done", "c1", "OK", {"server": "the-server"}),
                             ("done", "c2", "OK", {"server": "the-server"})]
    assert run.running == {} and run.waiting == []


def test_cancel_kills_the_running_call_and_starts_the_waiting_one() -> None:
    rec, finished = Recorder(), []
    release = gevent.event.Event()
    tool = blocking_tool("slow", release)
    run = runner(rec, limit=1, queue_size=1, finished=finished)
    ended: list[tuple[str, Any]] = []
    run.submit(ToolExecution("c1", "slow", {},
                             on_done=lambda e, err: ended.append((e.status, err))), tool)
    run.submit(ToolExecution("c2", "slow", {}), tool)
    gevent.sleep(0)
    assert run.cancel("c1") is True
    assert ("done", "c1", "CANCELLED", None) in rec.calls
    assert ended == [("cancelled", None)]
    assert list(run.running) == ["c2"] and run.waiting == []
    assert run.cancel("unknown") is False  # still answered CANCELLED: never left hanging
    assert rec.calls[-1] == ("done", "unknown", "CANCELLED", None)
    run.cancel_all()
    assert run.running == {} and run.executions == {}
    assert sorted(e.call_id for e in finished) == ["c1", "c2"]


def test_a_tool_that_times_out_fails_with_its_timeout() -> None:
    rec = Recorder()
    tool = blocking_tool("slow", gevent.event.Event(), timeout=10)
    run = runner(rec)
    run.submit(ToolExecution("c1", "slow", {}), tool)
    gevent.sleep(0.1)
    (kind, call_id, error), = rec.calls
    assert (kind, call_id) == ("fail", "c1")
    assert isinstance(error, ToolExecutionError) and "timed out after 10 ms" in error.message


def test_a_tool_that_raises_fails_the_call_then_reports_the_exception() -> None:
    rec = Recorder()
    boom = RuntimeError("boom")

    def execute(*_: Any) -> None:
        raise boom

    run = runner(rec)
    run.submit(ToolExecution("c1", "bad", {}), Tool("bad", "raises", OBJECT, execute=execute,
                                                    inline=True))
    (kind, call_id, error), failed = rec.calls
    assert (kind, call_id) == ("fail", "c1") and "tool 'bad' failed: boom" in error.message
    assert failed == ("failed", boom, "s1")


def test_a_result_that_breaks_the_output_schema_fails_the_call() -> None:
    rec = Recorder()
    tool = Tool("liar", "wrong result", OBJECT,
                {"type": "object", "required": ["n"]}, execute=lambda *_: {}, inline=True)
    runner(rec).submit(ToolExecution("c1", "liar", {}), tool)
    (kind, call_id, error), = rec.calls
    assert (kind, call_id) == ("fail", "c1")
    assert error.message.startswith("result: 'n' is a required property")
    assert error.detail == [{"path": "", "message": "'n' is a required property"}]


@pytest.mark.parametrize("inline", [True, False])
def test_on_done_hears_the_result(inline: bool) -> None:
    rec = Recorder()
    ended: list[tuple[str, Any]] = []
    add = Tool("add", "adds", OBJECT, execute=lambda p, *_: {"result": p["a"] + p["b"]},
               inline=inline)
    runner(rec).submit(ToolExecution("c1", "add", {"a": 1, "b": 2},
                                     on_done=lambda e, err: ended.append((e.result, err))), add)
    gevent.sleep(0.01)
    assert ended == [({"result": 3}, None)]


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"type": "number", "minimum": 0}},
     "required": ["n"]},  # outside the fast subset: jsonschema alone decides
])
def test_check_call_takes_the_fast_yes_and_words_the_refusal(schema: dict[str, Any]) -> None:
    from protoflask.core.errors import InvalidMessage, ToolNotFound
    from protoflask.tools import check_call

    tool = Tool("t", "takes n", schema, execute=lambda *_: {})
    check_call(tool, "t", {"n": 1})  # no exception
    with pytest.raises(InvalidMessage) as refused:
        check_call(tool, "t", {"n": "one"})
    assert refused.value.message.startswith("params.n: 'one' is not of type 'number'")
    assert refused.value.detail == [{"path": "n", "message": "'one' is not of type 'number'"}]
    with pytest.raises(ToolNotFound):
        check_call(None, "nope", {})
