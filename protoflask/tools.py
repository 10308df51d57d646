"""Tools: definitions with compiled JSON Schema validators, the registry, the built-ins,
each call's record (``ToolExecution``) and the check a call must pass to start. The
per-session executor that runs them is ``tool_runner.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

import gevent
import gevent.event
from jsonschema import validators
from jsonschema.exceptions import SchemaError

from .clock import now_ms
from .fastschema import compile_simple
from .streaming import StreamedText
from .core.coalesce import DEFAULT_MAX_CHARS, DEFAULT_MAX_DELAY_MS
from .core.errors import (
    InvalidMessage, ProtoError, ToolNotFound,
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
        #: (public: the runner's fast yes for a result, tool_runner.py)
        self.output_ok = compile_simple(self.output_schema)

    def param_errors(self, params: Any) -> list[dict[str, Any]]:
        if self._input_ok is not None and self._input_ok(params):
            return []
        return _errors(self._input, params)

    def result_errors(self, result: Any) -> list[dict[str, Any]]:
        if self.output_ok is not None and self.output_ok(result):
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
        #: ``get`` without a frame of its own (the dict is never replaced): every call
        self.find: Callable[[str], Tool | None] = self._tools.get
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


@dataclass(slots=True, init=False)
class ToolExecution:
    """One call's record (docs/PROTOCOL.md §12), handed to ``toolCall`` listeners.
    ``start_time`` is the clock's (``now_ms``) when not given."""

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

    def __init__(self, call_id: str, tool_name: str, arguments: Any, status: str = "pending",
                 start_time: int | None = None, end_time: int | None = None,
                 result: Any = None, progress: float | None = None, partial: Any = None,
                 run_id: str | None = None,
                 on_done: Callable[["ToolExecution", ProtoError | None], None] | None = None,
                 run_started: float | None = None) -> None:
        # the dataclass's own __init__, its start_time's default_factory (a frame of
        # now_ms on every call) written out: tests/tools/test_execution_init.py
        self.call_id = call_id
        self.tool_name = tool_name
        self.arguments = arguments
        self.status = status
        self.start_time = time.time_ns() // 1_000_000 if start_time is None else start_time
        self.end_time = end_time
        self.result = result
        self.progress = progress
        self.partial = partial
        self.run_id = run_id
        self.on_done = on_done
        self.run_started = run_started

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
