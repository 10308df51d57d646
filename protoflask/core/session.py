"""One session's protocol state machine: bytes in, events out, bytes to send.

No I/O and no clock: the caller passes ``now`` (ms) and pumps; after any call it drains
what happened with ``take_events()`` (the one way out for events):

    session.receive(raw, now)        -> a client message is processed
    session.send(outbound)           -> queue a server message
    session.take_writable(now)       -> [(seq, bytes)] ready for the transport
    session.tick(now)                -> heartbeat and expiry
    session.take_events()            -> the events all of that caused, for the application

The session's lifecycle is the TRANSITIONS table of ``state.py`` (h11 style: the transitions as
data): NEW -> GREETING on attach -> OPEN on HELLO -> DETACHED when the transport goes,
OPEN again on a resume; CLOSED (expired, or closed by the application) is final.

Rules, in the order a received message meets them (docs/PROTOCOL.md §2, §4, §5, §8):

0. Over the rate limit                  -> ERROR RATE_LIMITED, dropped unread (close 1008
                                           when the client keeps flooding)
1. Envelope invalid                      -> ERROR INVALID_MESSAGE (or MESSAGE_TOO_LARGE)
2. seq already seen                      -> dropped silently (a resend); else seq is recorded
   (seen.py: out-of-order seqs are processed; more than 1024 below the highest count as seen)
3. Unknown type                          -> ERROR UNSUPPORTED_TYPE
4. Not HELLO/PING before the handshake   -> ERROR HANDSHAKE_REQUIRED
5. Payload invalid                       -> ERROR INVALID_MESSAGE / MISSING_RUN_ID
6. USER message while back-pressured     -> ERROR CHANNEL_PAUSED (nothing spent)
7. Not a control type and no credit      -> ERROR INSUFFICIENT_CREDITS (nothing spent)
8. Processed; the channel's credit is topped up with FLOW_UPDATE when it runs low.

Downstream (outbound.py): a message is filtered by the client's accept_events when
queued, waits for credit, and is stamped with its seq when taken for the wire.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

from .meter import Meter
from .messages import (
    Outbound, error as error_message, ping as ping_message, run_finished, run_started, split_text,
    text_end, text_part, text_start, tool_done as tool_done_message,
    tool_update as tool_update_message,
)
from .calls import Call, CallRegistry, Run
from .credits import CreditLedger
from .envelope import byte_length, decode_json, parse_envelope, validate_envelope
from .errors import CloseCode, MessageTooLarge, ProtoError, RateLimited
from .events import (
    AudioReceived, CloseRequested, ErrorSent, Event, Expired, Handshake, HeartbeatTimedOut,
    RunChanged, SendRefused, SlowConsumer, TextReceived, ToolCallReceived, ToolCancelRequested,
    ToolListRequested,
)
from .outbound import OutboundQueue
from .ratelimit import RateLimiter, Verdict
from .state import RESET_STEPS, TRANSITIONS, SessionState, Transition
from .replay import ReplayWindow
from .seen import SeenSeqs
from .settings import SessionSettings
from .traffic import INVALID, TrafficCounters
from .upstream import Text, UpstreamHandlers

# The events and Run are defined in events.py and calls.py; they are exported here too
# because the session is where callers meet them.
__all__ = [
    "AudioReceived", "CloseRequested", "ErrorSent", "Event", "Expired", "Handshake",
    "HeartbeatTimedOut", "ProtocolSession", "Run", "RunChanged", "SendRefused",
    "SessionSettings", "SessionState", "SlowConsumer", "TextReceived", "ToolCallReceived",
    "ToolCancelRequested", "ToolListRequested",
]


_S = SessionState
_ATTACHED = frozenset({_S.GREETING, _S.OPEN})
_GREETED = frozenset({_S.OPEN, _S.DETACHED})
_CLOSED = _S.CLOSED
_ALLOW = Verdict.ALLOW  # enum members as constants: cheaper to read than off their class


class ProtocolSession(UpstreamHandlers):
    def __init__(self, session_id: str, user_id: str, settings: SessionSettings,
                 now: int, traffic: TrafficCounters | None = None, *,
                 greeted: bool = False) -> None:
        """``greeted``: the handshake was completed already (a session moved from another
        node)."""
        self.id = session_id
        self.user_id = user_id
        self.settings = settings
        self._state = SessionState.DETACHED if greeted else SessionState.NEW
        self.last_activity = now
        self.disconnected_at: int | None = now

        self.up_seqs = SeenSeqs()  # upstream seqs seen: the highest, and gaps below it
        self.last_ack = 0
        self.accept_events: frozenset[str] | None = None
        #: the protocol extensions the client asked for in its first HELLO (upstream.py)
        self.extensions: frozenset[str] = frozenset()
        self.rate = RateLimiter(settings.rate_limit, settings.rate_limit_burst, now)
        self._flooding = False  # closed for flooding: later messages are dropped silently
        self.credits = CreditLedger(settings.credits)
        # shared by every session of a server (the server's /metrics); own one otherwise
        self.traffic = traffic if traffic is not None else TrafficCounters()
        self._events: list[Event] = []
        self.outbound = OutboundQueue(session_id, settings, self.credits, self.traffic,
                                      self._events, self._is_connected)
        # The queue's own methods, not wrappers around them: the transports call these
        # for every message (docs/PERFORMANCE.md). take_writable: messages ready for the
        # wire, in seq order (see OutboundQueue.take_writable).
        self.has_writable: Callable[[], bool] = self.outbound.has_writable
        self.take_writable: Callable[[int], list[tuple[int, bytes]]] = \
            self.outbound.take_writable
        self.texts: dict[str, Text] = {}
        #: what the client made this session hold beyond its window (texts, calls, runs)
        self.meter = self.outbound.meter = Meter()
        self.registry = CallRegistry(settings.max_concurrent_runs, self.meter)
        #: the last number used in an id this session made (message and run ids); it
        #: moves with the session so that ids never repeat
        self.id_counter = 0
        self._ping_nonce: str | None = None
        self._ping_sent_at = 0
        self._next_ping_at = now + settings.heartbeat_interval

    # -- state ----------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    def _to(self, transition: Transition) -> None:
        before = self._state
        after = self._state = TRANSITIONS[before][transition]
        for on_queue, name, value in RESET_STEPS[transition]:  # the state beside the table
            setattr(self.outbound if on_queue else self, name, value)
        if (before in _ATTACHED) is not (after in _ATTACHED):  # the shared running count
            self.traffic.attached += 1 if after in _ATTACHED else -1

    @property
    def connected(self) -> bool:
        return self._state in _ATTACHED

    def _is_connected(self) -> bool:
        """``connected`` for the outbound queue (a bound method costs a session less than
        a lambda and its closure cell)."""
        return self._state in _ATTACHED

    @property
    def handshake_completed(self) -> bool:
        return self._state in _GREETED

    @property
    def closed(self) -> bool:
        """Expired or closed for good: no more sends."""
        return self._state is SessionState.CLOSED

    def close(self) -> None:
        """Close the session for good (the application dropped it)."""
        self._to(Transition.CLOSE)

    # -- views of the parts callers read --------------------------------------------------

    @property
    def upstream_seq(self) -> int:
        """The highest upstream seq seen."""
        return self.up_seqs.highest

    @property
    def runs(self) -> dict[str, Run]:
        return self.registry.runs

    @property
    def calls(self) -> dict[str, Call]:
        return self.registry.calls

    @property
    def replay(self) -> ReplayWindow:
        return self.outbound.replay

    @property
    def pending(self) -> list[Outbound]:
        return self.outbound.pending

    @property
    def downstream_seq(self) -> int:
        return self.outbound.downstream_seq

    @property
    def paused_by_client(self) -> set[str]:
        return self.outbound.paused_by_client

    @property
    def paused_by_server(self) -> set[str]:
        return self.outbound.paused_by_server

    @property
    def in_flight(self) -> int:
        return self.outbound.in_flight

    @property
    def pending_bytes(self) -> int:
        return self.outbound.pending_bytes

    @property
    def unsent_bytes(self) -> int:
        return self.outbound.unsent_bytes

    # -- connection lifecycle ------------------------------------------------------------

    def attach(self, now: int, last_seq: int | None = None) -> None:
        """A transport is (re)attached. With ``last_seq``, replay everything after it."""
        self._to(Transition.ATTACH)
        self.disconnected_at = None
        self.last_activity = now
        self._next_ping_at = now + self.settings.heartbeat_interval
        self.outbound.drop_resends()  # a fresh connection: nothing to resend yet
        if last_seq is not None:
            self._queue_replay(last_seq + 1, None, now, source="resume")

    def detach(self, now: int) -> None:
        self._to(Transition.DETACH)
        self.disconnected_at = now
        self.outbound.drop_resends()

    # -- upstream (the handlers are in upstream.py) --------------------------------------

    def receive(self, raw: bytes | str, now: int) -> None:
        """One client frame / line / body element."""
        verdict = self.rate.check(now)
        if verdict is not _ALLOW:
            self._rate_limited(verdict)
            return
        size = len(raw) if type(raw) is bytes else byte_length(raw)
        try:
            msg = parse_envelope(raw, max_size=self.settings.max_message_size,
                                 max_depth=self.settings.max_json_depth, size=size)
        except MessageTooLarge as exc:
            self.reject(exc)
            self._events.append(CloseRequested(CloseCode.TOO_LARGE, "message too large"))
            return
        except ProtoError as exc:
            self.reject(exc)
            return
        self.receive_message(msg, size, now)

    def receive_decoded(self, obj: Any, nbytes: int, now: int) -> None:
        """An element already decoded from a JSON array body."""
        verdict = self.rate.check(now)
        if verdict is not _ALLOW:
            self._rate_limited(verdict)
            return
        try:
            msg = validate_envelope(obj, max_depth=self.settings.max_json_depth)
        except ProtoError as exc:
            self.reject(exc)
            return
        self.receive_message(msg, nbytes, now)

    def _rate_limited(self, verdict: Verdict) -> None:
        """A message found no rate-limit token (``verdict``): it is dropped unread (so its
        seq is not recorded and it may be resent as it was)."""
        if not self._flooding:
            self._fail(RateLimited(
                f"more than {self.settings.rate_limit:g} messages per second (burst "
                f"{self.settings.rate_limit_burst}); message dropped",
                detail={"retry_after_ms": self.rate.retry_after_ms()}))
            if verdict is Verdict.CLOSE:
                self._flooding = True
                self._events.append(CloseRequested(CloseCode.POLICY_VIOLATION,
                                                   "rate limit exceeded"))

    def reject(self, exc: ProtoError) -> None:
        """Report a problem found outside the core (by a transport) as an ERROR; the
        message it was about counts as an invalid one received."""
        self.traffic.received[INVALID] += 1
        self._fail(exc)

    def _greeted(self) -> None:
        """A HELLO was accepted."""
        self._to(Transition.HELLO)

    # -- runs (also the application's API) -----------------------------------------------

    def start_run(self, now: int, run_id: str | None = None, thread_id: str | None = None,
                  metadata: Any = None) -> Run:
        self.registry.check_room()
        if run_id is None:
            run_id = f"{self.id}-run{self._next()}"
        run = self.registry.add_run(run_id, now, thread_id, metadata)
        self.send(run_started(run_id, thread_id))
        self._events.append(RunChanged("started", run))
        return run

    def finish_run(self, run_id: str, now: int, summary: Any = None, error: Any = None) -> Run:
        run = self.registry.end_run(run_id, now)
        run.status = "error" if error is not None else "finished"
        run.summary, run.error = summary, error
        self.send(run_finished(run_id, run.status, summary, error))
        self._events.append(RunChanged("finished", run))
        return run

    def cancel_run(self, run_id: str, now: int) -> Run:
        run = self.registry.end_run(run_id, now)
        run.status = "cancelled"
        calls = self.registry.calls_of(run_id)
        self.send(run_finished(run_id, "cancelled"))
        self._events.append(RunChanged("cancelled", run, calls))
        return run

    # -- tool calls (the application's side) ---------------------------------------------

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
        """TOOL_DONE ERROR with the error, plus the ERROR message (docs/PROTOCOL.md §4.4 Tools)."""
        call = self.registry.calls.get(call_id)
        if call is None:
            return False
        if exc.related_id is None:
            exc.related_id = call.message_id
        self.tool_done(call_id, "ERROR", error=exc)
        self._fail(exc)
        return True

    # -- downstream (the queue is outbound.py) -------------------------------------------

    def send(self, out: Outbound) -> bool:
        """Queue a server message. False when filtered out, closed, or the queue is full."""
        if self._state is _CLOSED:
            return False
        if self.accept_events is not None and out.type not in self.accept_events:
            return False
        return self.outbound.push(out)

    def send_text(self, text: str, content_type: str = "text/plain") -> str:
        """START, PARTs, END on AGENT with a fresh message_id; returns the id. The text is
        split into as many PARTs as it takes for no envelope to exceed maxMessageSize."""
        mid = f"{self.id}-m{self._next()}"
        self.send(text_start(mid, content_type))
        # what the stamped envelope adds around the payload: id and session hold the
        # session id, seq and ts at most 16 and 20 digits
        room = self.settings.max_message_size - (128 + 2 * len(self.id))
        for piece in split_text(mid, text, room):
            self.send(text_part(mid, piece))
        self.send(text_end(mid))
        return mid

    def set_in_flight(self, nbytes: int) -> None:
        """The transport reports how many bytes it is writing (0 once written)."""
        self.outbound.set_in_flight(nbytes)

    def _queue_replay(self, from_seq: int, to_seq: int | None, now: int, source: str,
                      related_id: str | None = None) -> None:
        error = self.outbound.queue_replay(from_seq, to_seq, now, source, related_id)
        if error is not None:
            self._fail(error)

    # -- time ----------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        """Heartbeat and expiry; call about once a second."""
        s = self.settings
        if self.connected:
            if self._ping_nonce is not None:
                if now - self._ping_sent_at >= s.heartbeat_timeout:
                    self._ping_nonce = None
                    self._events.append(HeartbeatTimedOut())
            elif now >= self._next_ping_at:
                self._ping_nonce = f"hb-{secrets.token_urlsafe(12)}"  # unguessable: no blind PONGs
                self._ping_sent_at = now
                self._next_ping_at = now + s.heartbeat_interval
                self.send(ping_message(self._ping_nonce))
        elif not self.closed and self.disconnected_at is not None and \
                now - self.disconnected_at >= s.replay_window_time:
            self._to(Transition.CLOSE)
            self._events.append(Expired())
        self.outbound.replay.prune(now)

    # -- events: the one way out ---------------------------------------------------------

    def has_events(self) -> bool:
        return bool(self._events)

    def take_events(self) -> list[Event]:
        """Every event caused since the last call (by receive, tick, sends, tool results,
        the application's calls), oldest first."""
        events = self._events
        if not events:
            return []
        taken = events[:]
        events.clear()  # the outbound queue appends to this same list
        return taken

    # -- helpers -------------------------------------------------------------------------

    def _fail(self, exc: ProtoError) -> None:
        """Send ERROR. Every ERROR costs the session a rate-limit token, like a message
        received (RATE_LIMITED itself excepted): a client whose messages all fail gets
        half the rate, and keeps flooding with them at its peril."""
        if not isinstance(exc, RateLimited):
            self.rate.charge()
        self.send(error_message(exc))
        self._events.append(ErrorSent(exc))

    def _under_load(self) -> bool:
        return self.outbound.under_load()

    def _next(self) -> int:
        self.id_counter += 1
        return self.id_counter

    def snapshot(self) -> dict[str, Any]:
        """The session fields (docs/PROTOCOL.md §12), with live values (plain data, camelCase)."""
        up = self.credits.upstream()
        ob = self.outbound
        return {
            "id": self.id,
            "userId": self.user_id,
            "connected": self.connected,
            "handshakeCompleted": self.handshake_completed,
            "lastActivity": self.last_activity,
            "credits": {ch: m for ch, (m, _) in up.items()},
            "byteCredits": {ch: b for ch, (_, b) in up.items()},
            "downstreamCredits": {ch: m for ch, (m, _) in self.credits.downstream().items()},
            "pausedChannels": set(ob.paused_by_client | ob.paused_by_server),
            "lastAck": str(self.last_ack),
            "lastDeliveredSeq": str(ob.downstream_seq),
            "lastClientSeq": str(self.upstream_seq),
            "replayWindow": {str(e.seq): decode_json(e.data) for e in ob.replay},
            "activeRuns": set(self.registry.runs),
            "pendingMessages": {str(i): o.to_dict() for i, o in enumerate(ob.pending)},
            "outboundBytes": ob.unsent_bytes,
        }

