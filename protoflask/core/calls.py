"""The runs and tool calls one session has open: bookkeeping only (the session sends
the messages and events that go with them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import DuplicateCallId, InvalidMessage, MaxRunsExceeded, RunNotFound
from .meter import Meter, OverBudget, memory_of


@dataclass(slots=True)
class Run:
    """A run (docs/PROTOCOL.md §12 Application API)."""

    run_id: str
    start_time: int
    thread_id: str | None = None
    status: str = "active"
    end_time: int | None = None
    metadata: Any = None
    summary: Any = None
    error: Any = None
    cost: int = 0  # what its metadata costs in memory, charged to the session's meter

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runId": self.run_id, "status": self.status,
                               "startTime": self.start_time}
        for key, value in (("threadId", self.thread_id), ("endTime", self.end_time),
                           ("metadata", self.metadata), ("summary", self.summary),
                           ("error", self.error)):
            if value is not None:
                out[key] = value
        return out


@dataclass(slots=True)
class Call:
    run_id: str | None
    message_id: str | None  # the TOOL_CALL's id; None for a call the application opened
    cost: int = 0  # what its params cost in memory (held until its TOOL_DONE), metered


class CallRegistry:
    """Active runs by id and open tool calls by call_id, their metadata and params
    charged to the session's meter while they are open."""

    __slots__ = ("max_runs", "runs", "calls", "meter")

    def __init__(self, max_runs: int, meter: Meter | None = None) -> None:
        self.max_runs = max_runs
        self.meter = meter if meter is not None else Meter()
        self.runs: dict[str, Run] = {}
        self.calls: dict[str, Call] = {}

    # -- runs -----------------------------------------------------------------------------

    def check_room(self) -> None:
        """Raise MaxRunsExceeded when no other run may start."""
        if len(self.runs) >= self.max_runs:
            raise MaxRunsExceeded(f"{len(self.runs)} runs are active (max {self.max_runs})")

    def add_run(self, run_id: str, now: int, thread_id: str | None, metadata: Any) -> Run:
        if run_id in self.runs:
            raise InvalidMessage(f"run {run_id!r} is already active")
        cost = memory_of(metadata) if metadata is not None else 0
        try:
            self.meter.charge(cost)
        except OverBudget as exc:  # no room for what the run would hold: as for a run too many
            raise MaxRunsExceeded(f"the run was refused: {exc}") from None
        run = self.runs[run_id] = Run(run_id, now, thread_id=thread_id, metadata=metadata,
                                      cost=cost)
        return run

    def end_run(self, run_id: str, now: int) -> Run:
        """Remove an active run (its status is the caller's to set)."""
        run = self.runs.pop(run_id, None)
        if run is None:
            raise RunNotFound(f"run {run_id!r} is not active in this session")
        run.end_time = now
        self.meter.release(run.cost)
        return run

    def calls_of(self, run_id: str) -> tuple[str, ...]:
        return tuple(cid for cid, call in self.calls.items() if call.run_id == run_id)

    # -- calls ----------------------------------------------------------------------------

    def add_call(self, call_id: str, run_id: str | None, message_id: str | None,
                 check_run: bool = False) -> None:
        """Open a call; with ``check_run``, only in an active run (or none)."""
        if call_id in self.calls:
            raise DuplicateCallId(f"call_id {call_id!r} is already running")
        if check_run and run_id is not None and run_id not in self.runs:
            raise RunNotFound(f"run {run_id!r} is not active in this session")
        self.calls[call_id] = Call(run_id, message_id)

    def charge_call(self, call_id: str, params: Any) -> None:
        """Charge an open call's params (held until it ends) to the meter, or raise
        MAX_RUNS_EXCEEDED (the call is still open: the caller ends it)."""
        cost = memory_of(params)
        try:
            self.meter.charge(cost)
        except OverBudget as exc:
            raise MaxRunsExceeded(f"the tool call was refused: {exc}") from None
        self.calls[call_id].cost = cost

    def open_charged_plain(self, call_id: str, run_id: str | None, message_id: str | None,
                           params: Any) -> None:
        """A client's call opened and its params charged: ``add_call`` then
        ``charge_call`` (DuplicateCallId with nothing changed; MAX_RUNS_EXCEEDED with the
        call open, for the caller to end). ``open_charged``'s definition."""
        self.add_call(call_id, run_id, message_id)
        self.charge_call(call_id, params)

    def open_charged_fast(self, call_id: str, run_id: str | None, message_id: str | None,
                          params: Any) -> None:
        """``open_charged_plain`` in one call, ``Meter.charge``'s charge within the
        meter's slice written out: every tool call takes it (docs/PERFORMANCE.md, "The
        tool row within 5%", "The tool row, branch tool7")."""
        calls = self.calls
        if call_id in calls:
            raise DuplicateCallId(f"call_id {call_id!r} is already running")
        call = calls[call_id] = Call(run_id, message_id)
        cost = memory_of(params)
        meter = self.meter
        spare = meter.spare
        if cost < spare:  # within the slice its account lent: no call
            meter.spare = spare - cost
            meter.held += cost
        else:
            try:
                meter.charge(cost)
            except OverBudget as exc:
                raise MaxRunsExceeded(f"the tool call was refused: {exc}") from None
        call.cost = cost

    #: the swap point: every client's tool call takes it (tests/core/test_call_charge.py
    #: runs the same calls over both)
    open_charged = open_charged_fast

    def end_call_plain(self, call_id: str) -> Call | None:
        """Close a call (None if it was not open) and give its params' bytes back.
        ``end_call``'s definition."""
        call = self.calls.pop(call_id, None)
        if call is not None:
            self.meter.release(call.cost)
        return call

    def end_call_fast(self, call_id: str) -> Call | None:
        """``end_call_plain`` with ``Meter.release`` written out as far as the meter's
        slice goes (every TOOL_DONE)."""
        call = self.calls.pop(call_id, None)
        if call is not None:
            cost = call.cost
            if cost:
                meter = self.meter
                spare = meter.spare + cost
                if spare <= meter.cap:  # kept in the slice
                    meter.spare = spare
                    meter.held -= cost
                else:
                    meter.release(cost)
        return call

    #: the swap point: every call's end takes it (tests/core/test_call_charge.py)
    end_call = end_call_fast

    # -- moving to another node (core.handoff) --------------------------------------------

    def export(self) -> tuple[list[list[Any]], dict[str, list[str | None]]]:
        """(runs, calls) as JSON-ready data: what a run needs to go on elsewhere."""
        if not self.runs and not self.calls:  # the common case: the cluster asks per batch
            return [], {}
        runs = [[r.run_id, r.start_time, r.thread_id, r.metadata] for r in self.runs.values()]
        calls = {cid: [c.run_id, c.message_id] for cid, c in self.calls.items()}
        return runs, calls

    def restore(self, runs: Any, calls: Any) -> None:
        for run_id, start_time, thread_id, metadata in runs or ():
            self.runs[run_id] = Run(run_id, start_time, thread_id=thread_id, metadata=metadata)
        for call_id, (run_id, message_id) in (calls or {}).items():
            self.calls[call_id] = Call(run_id, message_id)
