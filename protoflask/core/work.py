"""A session's work: its runs and tool calls as the protocol sees them. Opening, updating
and ending each (the client's RUN_* and TOOL_* messages, and the application's API,
docs/PROTOCOL.md §4.4, §12), the server messages that go with each and the events the
application hears. The bookkeeping is ``calls.py``'s ``CallRegistry``.

The session composes one, handing down what it needs of the session: ``send`` (queue a
server message), ``fail`` (send an ERROR), the session's event list, and ``next_id``
(the session's id counter, for run ids).
"""

from __future__ import annotations

from typing import Any, Callable

from .calls import CallRegistry, Run
from .envelope import Message
from .errors import MaxRunsExceeded, ProtoError, RunNotFound
from .events import Event, RunChanged, ToolCallReceived, ToolCancelRequested
from .messages import (
    Outbound, run_finished, run_started, tool_done as tool_done_message,
    tool_update as tool_update_message,
)


class Work:
    __slots__ = ("session_id", "registry", "send", "fail", "events", "next_id")

    def __init__(self, session_id: str, registry: CallRegistry,
                 send: Callable[[Outbound], bool], fail: Callable[[ProtoError], None],
                 events: list[Event], next_id: Callable[[], int]) -> None:
        self.session_id = session_id
        self.registry = registry
        self.send = send
        self.fail = fail
        self.events = events
        self.next_id = next_id

    # -- runs (the client's RUN_* and the application's API) ------------------------------

    def start_run(self, now: int, run_id: str | None = None, thread_id: str | None = None,
                  metadata: Any = None) -> Run:
        self.registry.check_room()
        if run_id is None:
            run_id = f"{self.session_id}-run{self.next_id()}"
        run = self.registry.add_run(run_id, now, thread_id, metadata)
        self.send(run_started(run_id, thread_id))
        self.events.append(RunChanged("started", run))
        return run

    def finish_run(self, run_id: str, now: int, summary: Any = None, error: Any = None) -> Run:
        run = self.registry.end_run(run_id, now)
        run.status = "error" if error is not None else "finished"
        run.summary, run.error = summary, error
        self.send(run_finished(run_id, run.status, summary, error))
        self.events.append(RunChanged("finished", run))
        return run

    def cancel_run(self, run_id: str, now: int) -> Run:
        run = self.registry.end_run(run_id, now)
        run.status = "cancelled"
        calls = self.registry.calls_of(run_id)
        self.send(run_finished(run_id, "cancelled"))
        self.events.append(RunChanged("cancelled", run, calls))
        return run

    # -- tool calls: the client's --------------------------------------------------------

    def call_received(self, msg: Message) -> None:
        """A TOOL_CALL (its envelope, payload and credit checked)."""
        p = msg.payload
        call_id = p["call_id"]
        run_id = p.get("run_id")
        registry = self.registry
        if run_id is not None and run_id not in registry.runs:
            registry.add_call(call_id, run_id, msg.id)  # (open: its TOOL_DONE ends it)
            self.fail_call(call_id, RunNotFound(f"run {run_id!r} is not active in this session"))
            return
        try:  # its params are held until its TOOL_DONE (queued calls' too)
            registry.open_charged(call_id, run_id, msg.id, p["params"])
        except MaxRunsExceeded as exc:  # (a DuplicateCallId goes up, the call not opened)
            self.fail_call(call_id, exc)
            return
        self.events.append(ToolCallReceived(call_id, p["tool"], p["params"], run_id, msg))

    def cancel_received(self, call_id: str) -> None:
        """A TOOL_CANCEL: the application is asked, if the call is open."""
        if call_id in self.registry.calls:
            self.events.append(ToolCancelRequested(call_id))

    # -- tool calls: the application's side ----------------------------------------------

    def open_call(self, call_id: str, run_id: str | None = None, params: Any = None) -> None:
        """A call the application starts itself (its agent calling a tool): from here on
        it is like a client's call, with TOOL_UPDATEs and exactly one TOOL_DONE, and
        cancelled with its run. MAX_RUNS_EXCEEDED when its params are over budget."""
        self.registry.add_call(call_id, run_id, None, check_run=True)
        try:
            self.registry.charge_call(call_id, params)
        except ProtoError:
            self.registry.end_call(call_id)
            raise

    def tool_update(self, call_id: str, status: str, progress: float | None = None,
                    partial: Any = None) -> bool:
        if call_id not in self.registry.calls:
            return False
        return self.send(tool_update_message(call_id, status, progress, partial))

    def tool_done(self, call_id: str, status: str, result: Any = None,
                  error: ProtoError | None = None) -> bool:
        """Finish a call with its single TOOL_DONE; False if it had already finished."""
        if self.registry.end_call(call_id) is None:
            return False
        self.send(tool_done_message(call_id, status, result, error))
        return True

    def fail_call(self, call_id: str, exc: ProtoError) -> bool:
        """TOOL_DONE ERROR with the error, plus the ERROR message (docs/PROTOCOL.md §4.4
        Tools)."""
        call = self.registry.calls.get(call_id)
        if call is None:
            return False
        if exc.related_id is None:
            exc.related_id = call.message_id
        self.tool_done(call_id, "ERROR", error=exc)
        self.fail(exc)
        return True
