"""What each event of a session's core becomes: a signal, a tool call started or
cancelled, a transport closed, a session expired. The engine runs every batch of events
(from ``receive``, ``tick`` or an operation on the session) through its ``Dispatcher``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from .core import messages
from .core.errors import CloseCode, OutboundQueueFull, ProtoError
from .core.session import (
    AudioReceived, CloseRequested, ErrorSent, Expired, Handshake, HeartbeatTimedOut,
    RunChanged, SendRefused, SlowConsumer, TextReceived, ToolCallReceived, ToolCancelRequested,
    ToolListRequested,
)
from .hub import Hub
from .live import LiveSession
from .stats import Stats
from .tool_runner import Report, SessionToolRunner, completed_report
from .tools import Tool, ToolExecution, ToolRegistry, check_call
from . import signals

log = logging.getLogger("protoflask")

#: the signal of every call started (its receivers looked at before the emit)
_TOOL_CALL = signals.tool_call
_RUN_SIGNALS = {"started": signals.run_started, "finished": signals.run_finished,
                "cancelled": signals.run_cancelled}


class Dispatcher:
    def __init__(self, *, hub: Hub, tools: ToolRegistry, stats: Stats,
                 emit: Callable[..., None], emit_error: Callable[..., None],
                 close_transport: Callable[[LiveSession, int, str], None],
                 expire: Callable[[LiveSession], None],
                 tool_runner: Callable[[LiveSession], SessionToolRunner],
                 settle_calls: Callable[[LiveSession], None],
                 heartbeat_timeout: int) -> None:
        self.hub = hub
        self.tools = tools
        self._find_tool = tools.find
        self.stats = stats
        self._emit = emit
        #: False when ``emit`` is the signals' own (``signals.emit`` bound to its sender):
        #: it does nothing for a signal nobody listens to, so that call is not made (a
        #: test's recording emit, or any other, is called for every signal)
        self._emit_unheard = getattr(emit, "func", None) is not signals.emit
        self._emit_error = emit_error
        self._close_transport = close_transport
        self._expire = expire
        self._tool_runner = tool_runner  # the session's, built on its first call
        #: apply what the runner reported (a refusal, QUEUED, an inline tool's TOOL_DONE,
        #: a cancel), pulled at once after each call made on the runner
        self._settle_calls = settle_calls
        self._heartbeat_timeout = heartbeat_timeout  # ms, for the log line
        #: one per event type: what the event becomes
        self._handlers: dict[type, Callable[[LiveSession, Any], None]] = {
            TextReceived: self._on_text, ToolCallReceived: self._start_call,
            ErrorSent: self._on_error_sent, Handshake: self._on_handshake,
            ToolCancelRequested: self._on_tool_cancel, ToolListRequested: self._on_tool_list,
            RunChanged: self._on_run_changed, AudioReceived: self._on_audio,
            CloseRequested: self._on_close_requested,
            HeartbeatTimedOut: self._on_heartbeat_timeout, SlowConsumer: self._on_slow_consumer,
            SendRefused: self._on_send_refused, Expired: self._on_expired,
        }

    def drain(self, live: LiveSession) -> None:
        """Act on the events the session's core buffered (after a call made on it
        outside ``receive`` / ``tick``, e.g. an application's run operation)."""
        self.dispatch(live, live.core.take_events())

    def dispatch(self, live: LiveSession, events: list[Any]) -> None:
        """Act on ``events``, then on those acting caused, until there are none."""
        handlers = self._handlers
        while events:
            for event in events:
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(live, event)
            events = live.core.take_events()

    def _on_text(self, live: LiveSession, event: TextReceived) -> None:
        self._emit(signals.text_message, session_id=live.id, message=event.message)

    def _on_error_sent(self, live: LiveSession, event: ErrorSent) -> None:
        self.stats.errors_sent += 1
        self.stats.count(self.stats.errors_by_code, event.error.code)
        self._emit(signals.error, error=event.error, session_id=live.id)

    def _on_handshake(self, live: LiveSession, event: Handshake) -> None:
        self._emit(signals.handshake, session_id=live.id, payload=event.payload)

    def _on_tool_cancel(self, live: LiveSession, event: ToolCancelRequested) -> None:
        self._cancel_call(live, event.call_id)

    def _cancel_call(self, live: LiveSession, call_id: str) -> None:
        if not self._tool_runner(live).cancel(call_id, pulled=True):
            self.hub.cancel_elsewhere(live.id, call_id)  # started on another node
        self._settle_calls(live)

    def _on_tool_list(self, live: LiveSession, event: ToolListRequested) -> None:
        live.core.send(messages.tool_list(t.to_dict() for t in self.tools))

    def _on_run_changed(self, live: LiveSession, event: RunChanged) -> None:
        signal = _RUN_SIGNALS[event.kind]
        self.stats.runs[event.kind if event.kind != "finished" else event.run.status] += 1
        for call_id in event.cancelled_calls:
            self._cancel_call(live, call_id)
        self._emit(signal, session_id=live.id, run=event.run)

    def _on_audio(self, live: LiveSession, event: AudioReceived) -> None:
        self._emit(signals.audio_chunk, session_id=live.id, message=event.message,
                   data=event.data)

    def _on_close_requested(self, live: LiveSession, event: CloseRequested) -> None:
        self._close_transport(live, event.code, event.reason)

    def _on_heartbeat_timeout(self, live: LiveSession, event: HeartbeatTimedOut) -> None:
        log.info("session %s: no PONG within %d ms; disconnecting", live.id,
                 self._heartbeat_timeout)
        self._close_transport(live, CloseCode.HEARTBEAT, "heartbeat timeout")

    def _on_slow_consumer(self, live: LiveSession, event: SlowConsumer) -> None:
        log.warning("session %s: client is not reading (%d bytes unsent); dropping its "
                    "connection, the session stays for resume", live.id, event.unsent_bytes)
        self._close_transport(live, CloseCode.SLOW_CONSUMER, "outbound buffer full")

    def _on_send_refused(self, live: LiveSession, event: SendRefused) -> None:
        self.stats.outbound_dropped += 1
        if event.why is not None:  # the memory budget (budget.py)
            log.warning("session %s: %s on %s dropped: %s", live.id, event.type,
                        event.channel, event.why)
            self._emit_error(OutboundQueueFull(
                f"{event.type} on {event.channel} dropped: {event.why}"), session_id=live.id)
            return
        log.warning("session %s: pending queue full; %s on %s dropped", live.id, event.type,
                    event.channel)
        self._emit_error(OutboundQueueFull(
            f"{event.type} on {event.channel} dropped: {len(live.core.pending)} messages "
            "are waiting for the client's credit or RESUME_CHANNEL"), session_id=live.id)

    def _on_expired(self, live: LiveSession, event: Expired) -> None:
        self._expire(live)

    def _start_call(self, live: LiveSession, event: ToolCallReceived) -> None:
        tool = self._find_tool(event.tool)
        accepts = tool._input_ok if tool is not None else None
        if accepts is None or not accepts(event.params):  # (check_call's fast yes, inline)
            try:
                check_call(tool, event.tool, event.params)
            except ProtoError as exc:
                live.core.work.fail_call(event.call_id, exc)
                return
        assert tool is not None
        execution = ToolExecution(event.call_id, tool.name, event.params, run_id=event.run_id)
        if live.link is not None:  # the open call, for a node that may take it over
            live.link.note_state(live)
        # (the core's id: LiveSession.id is a property, a second frame on every call;
        # nobody listening, as for every echo of the bench, no call: signals.emit would
        # return at this same test, made here at the same moment; tests/tools/
        # test_tool_call_signal.py)
        if _TOOL_CALL.receivers or self._emit_unheard:
            self._emit(_TOOL_CALL, session_id=live.core.id, execution=execution)
        if tool.execute is not None:
            self.run_call(live, execution, tool)

    def run_call_pulled(self, live: LiveSession, execution: ToolExecution, tool: Tool) -> None:
        """Start a call on the session's runner and apply what it reported at once
        (``run_call``'s definition)."""
        self._tool_runner(live).submit(execution, tool, pulled=True)
        self._settle_calls(live)

    def run_call_fast(self, live: LiveSession, execution: ToolExecution, tool: Tool) -> None:
        """``run_call_pulled`` with an inline tool's one report applied as the runner
        returns it, not kept for ``settle_calls``' loop to take (every echo's end:
        docs/PERFORMANCE.md, "The tool row within 5%"). While other reports wait, or
        another greenlet applies them, it takes its turn after them, as there."""
        runner = live.runner  # (Engine.tool_runner's first test: no frame once built)
        if runner is None:
            runner = self._tool_runner(live)
        if not tool.inline:
            runner.submit(execution, tool, pulled=True)
            self._settle_calls(live)
            return
        report = runner.run_inline(execution, tool)  # None: completed with its result
        if runner.pulling or runner.reports:
            runner.reports.append(report if report is not None
                                  else completed_report(execution))
            self._settle_calls(live)
            return
        runner.pulling = True  # (settle_calls': one greenlet applies at a time, in order)
        try:
            if report is not None or live.link is not None:
                self.apply_report(live, report if report is not None
                                  else completed_report(execution))
            else:  # apply_report of the completed report, without the report: every echo
                core = live.core
                work = runner.work
                if work is None:
                    work = runner.work = core.work
                work.tool_done(execution.call_id, "OK", execution.result)
                live.notify()  # (LiveSession.report's steps on one process)
                if core.events:
                    self.dispatch(live, core.take_events())
                if execution.on_done is not None:
                    execution.on_done(execution, None)
        finally:
            runner.pulling = False
        if runner.reports:  # made while it was applied (a signal receiver that waited)
            self._settle_calls(live)

    #: the swap point: every client's tool call takes it (tests/tools/test_run_call.py
    #: runs the same calls over both)
    run_call = run_call_fast

    def apply_report(self, live: LiveSession, report: Report) -> None:
        """One report of the session's runner applied: to the session, its events acted
        on, the waiting ``on_done`` told, the tool's exception signalled."""
        live.report(report)
        if live.core.events:  # (Engine.drain, without its call)
            self.dispatch(live, live.core.take_events())
        execution = report.execution
        if execution is not None and execution.on_done is not None:
            execution.on_done(execution, report.error)
        if report.raised is not None:
            self._emit_error(report.raised, session_id=live.id)
