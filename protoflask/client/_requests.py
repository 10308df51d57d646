"""The client's requests waiting for their answers: tool calls, runs, tool lists.

Each request is registered under the envelope id it was sent with, so that an ``ERROR``
naming it as ``related_id`` ends it; its answer (TOOL_DONE, RUN_STARTED, RUN_FINISHED,
TOOL_LIST) ends it too. Every method is called under the client's lock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .errors import ClientTimeout, ProtoClientError, RunError, ServerError, ToolCancelled, ToolError

#: ``on_progress(progress, status, partial)`` of a tool call, for each TOOL_UPDATE.
ProgressHandler = Callable[[float | None, str, Any], None]


@dataclass
class Waiter:
    """A request waiting for its answer (a HELLO, run, tool list or ping reply)."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.result, self.error = result, error
            self.done.set()

    def wait(self, timeout: float | None, what: str) -> Any:
        if not self.done.wait(timeout):
            raise ClientTimeout(f"no answer to {what} within {timeout}s")
        if self.error is not None:
            raise self.error
        return self.result


class MessageSender(Protocol):
    """What a ToolCall needs of its client: a way to send TOOL_CANCEL."""

    def send(self, type: str, channel: str = ..., payload: dict[str, Any] | None = ...
             ) -> str: ...


class ToolCall:
    """A tool call in progress: ``result(timeout)`` waits for its TOOL_DONE."""

    def __init__(self, client: MessageSender, call_id: str, tool: str,
                 on_progress: ProgressHandler | None) -> None:
        self.client, self.call_id, self.tool = client, call_id, tool
        self.on_progress = on_progress
        self.updates: list[dict[str, Any]] = []
        self._waiter = Waiter()

    @property
    def done(self) -> bool:
        return self._waiter.done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The tool's result; raises ToolError (with the contract code), ToolCancelled
        or ClientTimeout."""
        return self._waiter.wait(timeout, f"tool call {self.call_id} ({self.tool})")

    def cancel(self) -> None:
        """Ask the server to cancel; ``result()`` then raises ToolCancelled."""
        self.client.send("TOOL_CANCEL", "USER", {"call_id": self.call_id})

    def _end(self, result: Any = None, error: BaseException | None = None) -> None:
        self._waiter.resolve(result, error)


class Requests:
    """Tool calls, runs and tool lists waiting for the server's answer."""

    def __init__(self) -> None:
        self.calls: dict[str, ToolCall] = {}
        self.by_envelope: dict[str, Any] = {}  # envelope id -> Waiter / ToolCall
        self.runs_started: dict[str, Waiter] = {}
        self.runs_ended: dict[str, Waiter] = {}
        self.tool_lists: deque[Waiter] = deque()

    def waiters(self) -> list[Waiter]:
        """Every request waiter other than the tool calls'."""
        return [*self.runs_started.values(), *self.runs_ended.values(), *self.tool_lists]

    def fail_all(self, error: ProtoClientError) -> None:
        for call in self.calls.values():
            call._end(error=error)
        for waiter in self.waiters():
            waiter.resolve(error=error)
        self.calls.clear()
        self.by_envelope.clear()

    # -- answers: each returns False when no request of ours was waiting for it ---------------

    def on_tool_update(self, p: dict[str, Any]) -> bool:
        call = self.calls.get(p.get("call_id", ""))
        if call is None:
            return False
        call.updates.append(p)
        if call.on_progress is not None:
            call.on_progress(p.get("progress"), p.get("status", ""), p.get("partial"))
        return True

    def on_tool_done(self, p: dict[str, Any]) -> bool:
        call = self.calls.pop(p.get("call_id", ""), None)
        if call is None:
            return False
        status = p.get("status")
        if status == "OK":
            call._end(p.get("result"))
        elif status == "CANCELLED":
            call._end(error=ToolCancelled(call.call_id))
        else:
            err = p.get("error") or {}
            call._end(error=ToolError(
                err.get("code", "TOOL_EXECUTION_ERROR"), err.get("message", ""),
                err.get("detail"), call_id=call.call_id))
        return True

    def on_tool_list(self, p: dict[str, Any]) -> bool:
        if not self.tool_lists:
            return False
        self.tool_lists.popleft().resolve(p.get("tools", []))
        return True

    def on_run_started(self, p: dict[str, Any]) -> bool:
        waiter = self.runs_started.pop(p.get("run_id", ""), None)
        if waiter is None:
            return False
        waiter.resolve(p)
        return True

    def on_run_finished(self, p: dict[str, Any]) -> bool:
        waiter = self.runs_ended.pop(p.get("run_id", ""), None)
        if waiter is None:
            return False
        if p.get("status") == "error":
            err = p.get("error") or {}
            code = err.get("code", "RUN_ERROR") if isinstance(err, dict) else "RUN_ERROR"
            waiter.resolve(error=RunError(code, str(err), p))
        else:
            waiter.resolve(p)
        return True

    def on_error(self, p: dict[str, Any], related: Any) -> bool:
        """An ERROR about one of our requests ends it."""
        code, text = p.get("code", "ERROR"), p.get("message", "")
        target = self.by_envelope.pop(related, None) if related else None
        if isinstance(target, ToolCall):
            if not target.done:  # refused before it ran (DUPLICATE_CALL_ID, credits...)
                self.calls.pop(target.call_id, None)
                target._end(error=ToolError(code, text, p.get("detail"),
                                            call_id=target.call_id))
            return True  # the ERROR that follows a TOOL_DONE ERROR says nothing new
        if isinstance(target, Waiter) and not target.done.is_set():
            for table in (self.runs_started, self.runs_ended):
                for key, waiter in list(table.items()):
                    if waiter is target:
                        del table[key]
            if target in self.tool_lists:
                self.tool_lists.remove(target)
            target.resolve(error=ServerError(code, text, p.get("detail")))
            return True
        return False
