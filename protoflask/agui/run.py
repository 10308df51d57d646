"""The application's side of an AG-UI run: ``AguiRun``, what a handler registered with
``ProtoServer.agui_handler`` is given, and the greenlet that drives one run.

An AG-UI run is a protoflask run in the session of its thread, so everything a handler
does goes through the server's own API (``stream_text``, ``call_tool``, ``send_message``,
``finish_run``), handed down here as ``AguiServices``; what reaches the client is the
mapping of those messages (``mapping.py``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Mapping

import gevent
import orjson

from ..core import messages
from ..core.coalesce import DEFAULT_MAX_CHARS, DEFAULT_MAX_DELAY_MS
from ..core.errors import ProtoError, ToolCancelled
from ..streaming import StreamedText, stream_chunks
from .input import RunInput
from .mapping import AGUI_EVENT

log = logging.getLogger("protoflask.agui")


@dataclass(frozen=True)
class AguiServices:
    """What a run needs of the server above (its bound methods; never the server)."""

    #: (session_id, message): deliver to the session wherever it lives; False if gone
    deliver: Callable[[str, messages.Outbound], bool]
    call_tool: Callable[..., Any]  # (session_id, name, params, run_id=, call_id=)
    send_message: Callable[[str, Mapping[str, Any]], None]
    finish_run: Callable[..., Any]  # (session_id, run_id, summary=, error=)
    run_status: Callable[[str, str], str | None]  # (session_id, run_id) -> status or None
    #: (session_id, run_id) -> a stream's stop_reason: None while the run is active, else
    #: why not (``run_<status>``; ``run_finished`` once it is gone)
    watch_run: Callable[[str, str], Callable[[], str | None]]
    report_error: Callable[[BaseException, str], None]  # (error, session_id)
    #: the application's handler, or None: the built-in echo (echoMessages) answers
    handler: Callable[["AguiRun"], Any] | None
    echo: bool
    max_message_size: int


class AguiRun:
    """One AG-UI run, as its handler sees it.

    ``messages``, ``tools`` (the frontend's), ``context``, ``state`` and
    ``forwarded_props`` are the RunAgentInput's, as sent (camelCase inside). What the
    handler returns is the run's result (RUN_FINISHED ``result``); an exception it raises
    ends the run with RUN_ERROR."""

    def __init__(self, services: AguiServices, session_id: str, run_input: RunInput) -> None:
        self._services = services
        self.session_id = session_id
        self.input = run_input
        self.thread_id = run_input.thread_id
        self.run_id = run_input.run_id
        self.messages = run_input.messages
        self.tools = run_input.tools
        self.context = run_input.context
        self.state = run_input.state
        self.forwarded_props = run_input.forwarded_props

    @property
    def active(self) -> bool:
        """False once the run ended (finished, cancelled by the client's stop, failed)."""
        return self._services.run_status(self.session_id, self.run_id) == "active"

    @property
    def last_user_text(self) -> str | None:
        return self.input.last_user_text()

    def stream_text(self, chunks: Iterable[Any], content_type: str = "text/plain", *,
                    max_chars: int = DEFAULT_MAX_CHARS,
                    max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> StreamedText:
        """Stream a reply (TEXT_MESSAGE_START, CONTENTs, END) as ``ProtoServer.stream_text``
        does, in this run: it stops within one chunk when the run is stopped. Unlike it,
        it goes on when the thread's session moves to another node of a cluster (a
        re-attach there), delivering through the cluster."""
        services = self._services
        # no PART may exceed maxMessageSize: a character is at most 6 bytes of JSON
        max_chars = min(max_chars, max(1, (services.max_message_size - 1024) // 6))
        return stream_chunks(chunks, uuid.uuid4().hex, content_type,
                             send=partial(services.deliver, self.session_id),
                             stop_reason=services.watch_run(self.session_id, self.run_id),
                             max_chars=max_chars,
                             max_delay_ms=max_delay_ms)

    def call_tool(self, name: str, params: Mapping[str, Any] | None = None, *,
                  parent_message_id: str | None = None) -> Any:
        """Run a registered (server) tool in this run and return its result: the client
        sees TOOL_CALL_START/ARGS/END, the tool's progress (CUSTOM
        ``protoflask.tool_progress``) and TOOL_CALL_RESULT. Raises like
        ``ProtoServer.call_tool`` (the call's error, ToolCancelled)."""
        call_id = f"call-{uuid.uuid4().hex[:16]}"
        self._announce(call_id, name, dict(params or {}), parent_message_id)
        return self._services.call_tool(self.session_id, name, dict(params or {}),
                                        run_id=self.run_id, call_id=call_id)

    def call_frontend_tool(self, name: str, args: Mapping[str, Any] | None = None, *,
                           parent_message_id: str | None = None) -> str:
        """Ask the frontend to run one of its declared tools (``tools``): the client sees
        TOOL_CALL_START/ARGS/END and runs it; return from the handler then, and the
        client's next run carries the result as a ``tool`` message (its ``toolCallId`` is
        the id returned here)."""
        call_id = f"call-{uuid.uuid4().hex[:16]}"
        self._announce(call_id, name, dict(args or {}), parent_message_id)
        return call_id

    def set_state(self, snapshot: Any) -> None:
        """STATE_SNAPSHOT: the agent state, whole."""
        self.emit({"type": "STATE_SNAPSHOT", "snapshot": snapshot})
        self.state = snapshot

    def patch_state(self, operations: list[dict[str, Any]]) -> None:
        """STATE_DELTA: RFC 6902 operations on the agent state."""
        self.emit({"type": "STATE_DELTA", "delta": operations})

    def emit(self, event: Mapping[str, Any]) -> None:
        """Send any AG-UI event (camelCase, with its ``type``) in this run, e.g. a CUSTOM
        or STEP_STARTED; it is sequenced, replayed and re-attached like the rest."""
        if not isinstance(event.get("type"), str):
            raise ValueError("an AG-UI event needs a string 'type'")
        self._services.send_message(self.session_id, {
            "type": AGUI_EVENT, "channel": "AGENT", "payload": dict(event)})

    def _announce(self, call_id: str, name: str, args: dict[str, Any],
                  parent_message_id: str | None) -> None:
        start: dict[str, Any] = {"type": "TOOL_CALL_START", "toolCallId": call_id,
                                 "toolCallName": name}
        if parent_message_id is not None:
            start["parentMessageId"] = parent_message_id
        self.emit(start)
        self.emit({"type": "TOOL_CALL_ARGS", "toolCallId": call_id,
                   "delta": orjson.dumps(args).decode()})
        self.emit({"type": "TOOL_CALL_END", "toolCallId": call_id})


def echo_handler(run: AguiRun) -> None:
    """Without an application handler: the built-in echo answers the last user message
    (as ``echoMessages`` does on the native wire)."""
    text = run.last_user_text
    if text:
        run.stream_text([text])


def start_run_handler(services: AguiServices, session_id: str, run_input: RunInput) -> None:
    """Run the application's handler for a started run in a greenlet of its own, and end
    the run with what it did: finished (its return value as the result), or error."""
    gevent.spawn(_drive, services, AguiRun(services, session_id, run_input))


def _drive(services: AguiServices, run: AguiRun) -> None:
    handler = services.handler or (echo_handler if services.echo else None)
    summary: Any = None
    error: dict[str, Any] | None = None
    try:
        if handler is not None:
            summary = handler(run)
    except ToolCancelled:
        pass  # the run was stopped: it has ended already
    except Exception as exc:  # the handler failed: the run ends with RUN_ERROR
        code = exc.code if isinstance(exc, ProtoError) else "INTERNAL_ERROR"
        error = {"code": code, "message": str(exc) or type(exc).__name__}
        if not isinstance(exc, ProtoError):
            log.exception("AG-UI handler failed (thread %s, run %s)", run.thread_id, run.run_id)
        services.report_error(exc, run.session_id)
    try:
        if services.run_status(run.session_id, run.run_id) == "active":
            services.finish_run(run.session_id, run.run_id, summary=summary, error=error)
    except ProtoError:
        pass  # the run ended meanwhile (stopped) or the session expired
