"""The per-session executor of tool calls: a gevent pool bounded by maxConcurrentRuns
plus a queue (the tools themselves, the registry and the calls' records are
``tools.py``).

The executor calls nothing above it: it calls a tool's ``execute`` with the context it
was given (the server, as ``ToolContext`` names it; the executor only passes it on),
records what each call came to as ``Report``s, and rings its sink's bell (``bell.py``);
the session layer pulls them (``take_reports``) and applies them to the session.
"""

from __future__ import annotations

import logging
from time import perf_counter
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import gevent
from gevent import Greenlet

from .bell import Bell
from .clock import now_ms, now_ns
from .core.errors import MaxRunsExceeded, ProtoError, ToolExecutionError
from .tools import MAX_SCHEMA_ERRORS, Tool, ToolContext, ToolExecution, schema_failure

log = logging.getLogger("protoflask.tools")


@dataclass(frozen=True, slots=True)
class CallSink:
    """What a session's tool runner is handed by the layer above it: values and a bell,
    no callable of that layer's (the runner holds neither the session nor the server)."""

    session_id: str
    #: the fourth argument of every ``execute(params, session_id, call_id, server)``:
    #: the server, passed on by the runner (None: an engine without a server, in tests)
    context: ToolContext | None
    #: rung when reports wait (``SessionToolRunner.take_reports``)
    bell: Bell


@dataclass(slots=True)
class Report:
    """What one call came to, for the session layer to apply: ``kind`` "update" (a TOOL_UPDATE
    with ``status``: QUEUED), "done" (its TOOL_DONE with ``status`` and ``result``: OK,
    CANCELLED) or "fail" (its TOOL_DONE ERROR with ``error``); the tool's own exception
    (``raised``: the ``error`` signal); the execution whose ``on_done`` hears the end."""

    kind: str
    call_id: str
    status: str = ""
    result: Any = None
    error: ProtoError | None = None
    raised: BaseException | None = None
    execution: "ToolExecution | None" = None


class ToolTally(Protocol):
    """Counts of tool calls running and queued, summed over runners."""
    running: int
    queued: int


class _OwnTally:
    __slots__ = ("running", "queued")

    def __init__(self) -> None:
        self.running = self.queued = 0


class SessionToolRunner:
    """Runs one session's tool calls: at most ``limit`` at once, ``queue_size`` waiting.
    Every call it accepts ends in exactly one TOOL_DONE: a report (see the module doc)."""

    __slots__ = ("sink", "on_finish", "limit", "queue_size", "default_timeout_ms", "running",
                 "waiting", "executions", "tally", "reports", "pulling", "caller_pulls",
                 "work")

    def __init__(self, sink: CallSink, limit: int, queue_size: int, default_timeout_ms: int,
                 on_finish: Callable[[ToolExecution], None] | None = None,
                 tally: "ToolTally | None" = None) -> None:
        self.sink = sink
        #: the server's running counts over every runner (``stats.ToolCounters``), moved
        #: with each change to ``running`` and ``waiting`` so /metrics need not add them up
        self.tally = tally if tally is not None else _OwnTally()
        self.on_finish = on_finish  # every ended execution (the server's tool metrics)
        self.limit = limit
        self.queue_size = queue_size
        self.default_timeout_ms = default_timeout_ms
        self.running: dict[str, Greenlet] = {}
        self.waiting: list[tuple[ToolExecution, Tool]] = []  # short; a deque costs 760 B idle
        self.executions: dict[str, ToolExecution] = {}
        self.reports: list[Report] = []
        #: the layer above is taking and applying reports (one greenlet at a time, so
        #: that a call's reports reach the session in the order they were made)
        self.pulling = False
        #: inside a ``submit`` or ``cancel`` whose caller pulls the reports at once: no ring
        #: (docs/PERFORMANCE.md, "Tool calls and the runner's bell")
        self.caller_pulls = False
        #: the session core's ``Work`` (core/work.py), kept here by the layer above on its
        #: first inline call's end (``Dispatcher.run_call_fast``): a session's Work, once
        #: made, is never replaced, and the core's lazy property is a frame per call
        self.work: Any = None

    def take_reports(self) -> list[Report]:
        """What the calls came to since the last take, oldest first."""
        reports = self.reports
        if not reports:
            return []
        self.reports = []
        return reports

    def _report(self, report: Report) -> None:
        self.reports.append(report)
        if not self.caller_pulls:
            self.sink.bell.ring()

    def submit(self, execution: ToolExecution, tool: Tool, *, pulled: bool = False) -> None:
        """Start a call (or queue it, or refuse it). ``pulled``: the caller takes the
        reports this makes (``take_reports``) as soon as it returns, so no bell rings."""
        self.caller_pulls = pulled
        try:
            self._submit(execution, tool)
        finally:
            self.caller_pulls = False

    def run_inline(self, execution: ToolExecution, tool: Tool) -> Report | None:
        """``submit`` of an inline tool for a caller that applies its one report at once
        (``Dispatcher.run_call_fast``): the report is returned, not kept; no bell rings.
        None for the common end, the call completed with a result its outputSchema takes:
        its report would be ``completed_report(execution)``, which the caller builds
        only if it must keep it (``_run`` and ``finish`` written out, without the report:
        docs/PERFORMANCE.md, "The tool row within 5%")."""
        call_id = execution.call_id
        executions = self.executions
        executions[call_id] = execution
        execution.status = "running"
        execution.run_started = perf_counter()
        try:
            assert tool.execute is not None
            result = tool.execute(execution.arguments, self.sink.session_id, call_id,
                                  self.sink.context)
        except Exception as exc:  # a tool's own failure, reported to the client
            return self._failed(execution, tool, exc, keep=False)
        accepts = tool.output_ok
        if accepts is None or not accepts(result):
            return self._checked(execution, tool, result, keep=False)
        execution.status = "completed"  # finish's steps for "completed"
        execution.end_time = now_ns() // 1_000_000  # (now_ms, without its call)
        execution.result = result
        executions.pop(call_id, None)
        if self.on_finish is not None:
            self.on_finish(execution)
        return None

    def _submit(self, execution: ToolExecution, tool: Tool) -> None:
        self.executions[execution.call_id] = execution
        if tool.inline:
            self._run(execution, tool)  # never blocks: no greenlet, no timer
        elif len(self.running) < self.limit:
            self._spawn(execution, tool)
        elif len(self.waiting) < self.queue_size:
            self.waiting.append((execution, tool))
            self.tally.queued += 1
            self._report(Report("update", execution.call_id, "QUEUED"))
        else:
            self.finish(execution, "error", MaxRunsExceeded(
                f"{len(self.running)} tool calls running and {len(self.waiting)} queued"))

    def cancel(self, call_id: str, *, pulled: bool = False) -> bool:
        """TOOL_DONE CANCELLED now; a running execution is killed. Returns whether the
        call was executing or waiting here. ``pulled`` as for ``submit``."""
        self.caller_pulls = pulled
        try:
            return self._cancel(call_id)
        finally:
            self.caller_pulls = False

    def _cancel(self, call_id: str) -> bool:
        execution = self.executions.get(call_id)
        if execution is not None:
            execution.status = "cancelled"
            execution.end_time = now_ms()
        # (its on_done is the reader's to call, with the report: after the TOOL_DONE)
        self._report(Report("done", call_id, "CANCELLED", execution=execution))
        self.executions.pop(call_id, None)
        waiting = len(self.waiting)
        self.waiting = [w for w in self.waiting if w[0].call_id != call_id]
        self.tally.queued -= waiting - len(self.waiting)
        greenlet = self.running.pop(call_id, None)
        if greenlet is not None:
            self.tally.running -= 1
            greenlet.kill(block=False)
            self._start_waiting()
        if execution is not None and self.on_finish is not None:
            self.on_finish(execution)
        return execution is not None

    def cancel_all(self, *, pulled: bool = False) -> None:
        for call_id in list(self.executions):
            self.cancel(call_id, pulled=pulled)

    def finish(self, execution: ToolExecution, status: str, error: ProtoError | None = None,
               result: Any = None, raised: BaseException | None = None,
               keep: bool = True) -> Report:
        """End the call: its report, kept (``_report``) unless ``keep`` is False, returned."""
        execution.status = status
        execution.end_time = now_ms()
        execution.result = result
        self.executions.pop(execution.call_id, None)
        if self.on_finish is not None:
            self.on_finish(execution)
        failed = error is not None  # (a failure has no result; only a failure has raised)
        report = Report("fail" if failed else "done", execution.call_id, "" if failed else "OK",
                        result, error, raised, execution)
        if keep:
            self._report(report)
        return report

    def _spawn(self, execution: ToolExecution, tool: Tool) -> None:
        if execution.call_id not in self.running:
            self.tally.running += 1
        self.running[execution.call_id] = gevent.spawn(self._execute, execution, tool)

    def _start_waiting(self) -> None:
        while self.waiting and len(self.running) < self.limit:
            self.tally.queued -= 1
            self._spawn(*self.waiting.pop(0))

    def _execute(self, execution: ToolExecution, tool: Tool) -> None:
        """A call in its own greenlet, under the tool's timeout."""
        call_id = execution.call_id
        timeout_ms = tool.timeout if tool.timeout is not None else self.default_timeout_ms
        timer = gevent.Timeout(timeout_ms / 1000.0)
        timer.start()
        try:
            self._run(execution, tool)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            self.finish(execution, "error", ToolExecutionError(
                f"tool {tool.name!r} timed out after {timeout_ms:g} ms"))
        except gevent.GreenletExit:
            pass  # cancelled: cancel() already sent TOOL_DONE CANCELLED
        finally:
            timer.close()
            if self.running.get(call_id) is gevent.getcurrent():
                del self.running[call_id]
                self.tally.running -= 1
            self._start_waiting()

    def _run(self, execution: ToolExecution, tool: Tool, keep: bool = True) -> Report:
        """Execute, check the result, finish the call; a tool's exception is its failure."""
        execution.status = "running"
        execution.run_started = perf_counter()
        try:
            assert tool.execute is not None
            result = tool.execute(execution.arguments, self.sink.session_id,
                                  execution.call_id, self.sink.context)
        except Exception as exc:  # a tool's own failure, reported to the client
            return self._failed(execution, tool, exc, keep)
        return self._checked(execution, tool, result, keep)

    def _failed(self, execution: ToolExecution, tool: Tool, exc: Exception,
                keep: bool) -> Report:
        log.warning("tool %r failed: %s", tool.name, exc, exc_info=True)
        return self.finish(execution, "error", ToolExecutionError(
            f"tool {tool.name!r} failed: {exc}"), raised=exc, keep=keep)

    def _checked(self, execution: ToolExecution, tool: Tool, result: Any,
                 keep: bool) -> Report:
        """The call finished with ``result``, or with its error if the outputSchema
        refuses it."""
        accepts = tool.output_ok  # the fast yes without a list (result_errors' first step)
        if accepts is not None and accepts(result):
            problems = None
        else:
            problems = tool.result_errors(result)
        if problems:
            return self.finish(execution, "error", ToolExecutionError(
                schema_failure("result", f"outputSchema of {tool.name!r}", problems),
                detail=problems[:MAX_SCHEMA_ERRORS]), keep=keep)
        return self.finish(execution, "completed", result=result, keep=keep)


def completed_report(execution: ToolExecution) -> Report:
    """The report ``finish`` makes of a call completed with its result."""
    return Report("done", execution.call_id, "OK", execution.result, None, None, execution)
