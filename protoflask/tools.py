"""Tools: definitions with compiled JSON Schema validators, the registry, the built-ins,
and the per-session executor (a gevent pool bounded by maxConcurrentRuns plus a queue).

The executor calls nothing above it: it calls a tool's ``execute`` with the context it
was given (the server, as ``ToolContext`` names it; the executor only passes it on),
records what each call came to as ``Report``s, and rings its sink's bell (``bell.py``);
the session layer pulls them (``take_reports``) and applies them to the session.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

import gevent
import gevent.event
from gevent import Greenlet
from jsonschema import validators
from jsonschema.exceptions import SchemaError

from .bell import Bell
from .clock import now_ms
from .fastschema import compile_simple
from .streaming import StreamedText
from .core.coalesce import DEFAULT_MAX_CHARS, DEFAULT_MAX_DELAY_MS
from .core.errors import (
    InvalidMessage, MaxRunsExceeded, ProtoError, ToolExecutionError, ToolNotFound,
)
from .core.errors import ToolCancelled  # noqa: F401 - re-exported (protoflask.ToolCancelled)

log = logging.getLogger("protoflask.tools")

Execute = Callable[..., Any]


@dataclass
class Tool:
    """docs/PROTOCOL.md §12. ``execute(params, session_id, call_id, server)`` returns the result or
    raises; without ``execute`` the application finishes calls via ``send_tool_done``."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    execute: Execute | None = None
    timeout: float | None = None  # ms; None uses the server's toolTimeout
    #: Run ``execute`` directly in the connection's greenlet: only for tools that never
    #: block or take long (pure computation), which then skip the pool, the queue and
    #: the timeout. The built-ins are inline.
    inline: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a tool needs a non-empty name")
        self._input = _compile(self.input_schema, f"tool {self.name!r} inputSchema")
        self._output = _compile(self.output_schema, f"tool {self.name!r} outputSchema")
        # jsonschema costs tens of microseconds a call; simple schemas get a fast yes
        self._input_ok = compile_simple(self.input_schema)
        self._output_ok = compile_simple(self.output_schema)

    def param_errors(self, params: Any) -> list[dict[str, Any]]:
        if self._input_ok is not None and self._input_ok(params):
            return []
        return _errors(self._input, params)

    def result_errors(self, result: Any) -> list[dict[str, Any]]:
        if self._output_ok is not None and self._output_ok(result):
            return []
        return _errors(self._output, result)

    def to_dict(self) -> dict[str, Any]:
        """The wire view, without execute (docs/PROTOCOL.md §4.4 Tools)."""
        return {"name": self.name, "description": self.description,
                "inputSchema": self.input_schema, "outputSchema": self.output_schema}

    @classmethod
    def from_function(cls, fn: Execute, name: str | None = None, *,
                      description: str | None = None,
                      input_schema: dict[str, Any] | None = None,
                      output_schema: dict[str, Any] | None = None,
                      timeout: float | None = None, inline: bool = False) -> "Tool":
        """What the ``tool`` decorators build: the name defaults to the function's, the
        description to its docstring, the schemas to any object / anything."""
        return cls(name=name or fn.__name__,
                   description=description or (fn.__doc__ or "").strip() or fn.__name__,
                   input_schema=input_schema or {"type": "object"},
                   output_schema=output_schema or {},
                   execute=fn, timeout=timeout, inline=inline)


def _compile(schema: Any, what: str) -> Any:
    if not isinstance(schema, dict):
        raise ValueError(f"{what} must be a JSON Schema object")
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"{what} is not a valid JSON Schema: {exc.message}") from None
    return cls(schema)


#: Schema errors reported per failing value, and the longest message kept of each: a
#: hostile or careless payload (a list of 10,000 wrong items) must not make the ERROR
#: (or the validation) unbounded. docs/PROTOCOL.md states both limits.
MAX_SCHEMA_ERRORS = 5
MAX_SCHEMA_ERROR_CHARS = 200


def _truncate(text: str, limit: int = MAX_SCHEMA_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _errors(validator: Any, value: Any) -> list[dict[str, Any]]:
    """At most MAX_SCHEMA_ERRORS + 1 errors (the extra one only says "there are more"),
    each ``{"path": "a/0/b", "message": ...}`` with the message truncated."""
    return [{"path": "/".join(str(p) for p in e.absolute_path), "message": _truncate(e.message)}
            for e in islice(validator.iter_errors(value), MAX_SCHEMA_ERRORS + 1)]


def dotted(root: str, path: str) -> str:
    """``params`` + ``a/0/b`` -> ``params.a[0].b`` (how a person reads a field name)."""
    out = root
    for part in path.split("/") if path else ():
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def schema_failure(root: str, what: str, problems: list[dict[str, Any]]) -> str:
    """One line naming the first failing field and why, e.g. ``params.a: 'x' is not of
    type 'number'``, then how many more there are (the full list goes in ``detail``)."""
    first = problems[0]
    line = f"{dotted(root, first['path'])}: {first['message']}"
    more = len(problems) - 1
    if more >= MAX_SCHEMA_ERRORS:
        line += f" (and more errors; {what})"
    elif more:
        line += f" (and {more} more error{'s' if more > 1 else ''}; {what})"
    else:
        line += f" ({what})"
    return line


def _echo(params: dict[str, Any], *_: Any) -> dict[str, Any]:
    return {"echoed": params["message"]}


def _add(params: dict[str, Any], *_: Any) -> dict[str, Any]:
    return {"result": params["a"] + params["b"]}


def builtin_tools() -> list[Tool]:
    return [
        Tool("echo", "Returns the message it is given.",
             {"type": "object", "properties": {"message": {"type": "string"}},
              "required": ["message"], "additionalProperties": False},
             {"type": "object", "properties": {"echoed": {"type": "string"}},
              "required": ["echoed"]},
             _echo, inline=True),
        Tool("add", "Adds two numbers.",
             {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
              "required": ["a", "b"], "additionalProperties": False},
             {"type": "object", "properties": {"result": {"type": "number"}},
              "required": ["result"]},
             _add, inline=True),
    ]


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        #: called (no arguments, must not block) after every register / unregister: the
        #: MCP endpoint's tools/list_changed follows the registry through it
        self.listeners: list[Callable[[], None]] = []

    def register(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise TypeError("register_tool takes a protoflask.Tool")
        self._tools[tool.name] = tool
        self._changed()

    def unregister(self, name: str) -> bool:
        removed = self._tools.pop(name, None) is not None
        if removed:
            self._changed()
        return removed

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


@dataclass(slots=True)
class ToolExecution:
    """One call's record (docs/PROTOCOL.md §12), handed to ``toolCall`` listeners."""

    call_id: str
    tool_name: str
    arguments: Any
    status: str = "pending"
    start_time: int = field(default_factory=now_ms)
    end_time: int | None = None
    result: Any = None
    progress: float | None = None
    partial: Any = None
    run_id: str | None = None
    #: called once when the call ends: (execution, the error or None); its ``status``
    #: is then "completed", "error" or "cancelled" (``call_tool`` waits on it)
    on_done: Callable[["ToolExecution", ProtoError | None], None] | None = field(
        default=None, repr=False, compare=False)
    #: time.perf_counter() when execute was called (None until then): its duration metric
    run_started: float | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {"callId": self.call_id, "toolName": self.tool_name, "arguments": self.arguments,
               "status": self.status, "startTime": self.start_time}
        for key, value in (("endTime", self.end_time), ("result", self.result),
                           ("progress", self.progress), ("partial", self.partial)):
            if value is not None:
                out[key] = value
        return out


def awaited_call(call_id: str) -> tuple["gevent.event.AsyncResult",
                                        Callable[[ToolExecution, BaseException | None], None]]:
    """What ``call_tool`` waits on, and the ``on_done`` that settles it once: the call's
    result, its error, or ToolCancelled when it was cancelled."""
    outcome: gevent.event.AsyncResult = gevent.event.AsyncResult()

    def done(execution: ToolExecution, error: BaseException | None) -> None:
        if outcome.ready():
            return
        if error is not None:
            outcome.set_exception(error)
        elif execution.status == "cancelled":
            outcome.set_exception(ToolCancelled(f"tool call {call_id!r} was cancelled"))
        else:
            outcome.set(execution.result)
    return outcome, done


class ToolContext(Protocol):
    """What every ``execute(params, session_id, call_id, server)`` is given last: the
    server (``ProtoServer``, which checks it has these). The runner, the engine and the
    adapters only pass it on; these are what a tool reaches its session with (docs/
    PROTOCOL.md §12; the rest of the server's public API is there too)."""

    def send_tool_update(self, session_id: str, call_id: str, status: str = "RUNNING",
                         progress: float | None = None, partial: Any = None) -> bool: ...
    def send_message(self, session_id: str, message: Mapping[str, Any]) -> None: ...
    def stream_text(self, session_id: str, chunks: Iterable[Any], run_id: str | None = None,
                    content_type: str = "text/plain", *, max_chars: int = DEFAULT_MAX_CHARS,
                    max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> StreamedText: ...
    def call_tool(self, session_id: str, name: str, params: Mapping[str, Any] | None = None,
                  *, run_id: str | None = None, call_id: str | None = None) -> Any: ...
    def get_session(self, session_id: str) -> dict[str, Any] | None: ...


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
                 "waiting", "executions", "tally", "reports", "pulling", "caller_pulls")

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

    def run_inline(self, execution: ToolExecution, tool: Tool) -> Report:
        """``submit`` of an inline tool for a caller that applies its one report at once
        (``Dispatcher.run_call_fast``): the report is returned, not kept; no bell rings."""
        self.executions[execution.call_id] = execution
        return self._run(execution, tool, keep=False)

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
        execution.run_started = time.perf_counter()
        try:
            assert tool.execute is not None
            result = tool.execute(execution.arguments, self.sink.session_id,
                                  execution.call_id, self.sink.context)
        except Exception as exc:  # a tool's own failure, reported to the client
            log.warning("tool %r failed: %s", tool.name, exc, exc_info=True)
            return self.finish(execution, "error", ToolExecutionError(
                f"tool {tool.name!r} failed: {exc}"), raised=exc, keep=keep)
        accepts = tool._output_ok  # the fast yes without a list (result_errors' first step)
        if accepts is not None and accepts(result):
            problems = None
        else:
            problems = tool.result_errors(result)
        if problems:
            return self.finish(execution, "error", ToolExecutionError(
                schema_failure("result", f"outputSchema of {tool.name!r}", problems),
                detail=problems[:MAX_SCHEMA_ERRORS]), keep=keep)
        return self.finish(execution, "completed", result=result, keep=keep)


def check_call(tool: Tool | None, name: str, params: Any) -> None:
    """Raise the contract's error for a call that cannot start."""
    if tool is None:
        raise ToolNotFound(f"no tool named {name!r}")
    accepts = tool._input_ok  # the fast yes without a list (param_errors' first step)
    if accepts is not None and accepts(params):
        return
    problems = tool.param_errors(params)
    if problems:
        raise InvalidMessage(
            schema_failure("params", f"inputSchema of {name!r}", problems),
            detail=problems[:MAX_SCHEMA_ERRORS])
