"""One session's protocol state machine: bytes in, events out, bytes to send.

No I/O and no clock: the caller passes ``now`` (ms) and pumps:

    session.receive(raw, now)        -> list of events for the application
    session.send(outbound)           -> queue a server message
    session.take_writable(now)       -> [(seq, bytes)] ready for the transport
    session.tick(now)                -> heartbeat / expiry events

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

Downstream, a message is filtered by the client's accept_events when queued, then
waits in the pending queue until its channel has credit and is not paused; only
then does it get the next downstream seq and enter the replay window, so wire
order is seq order. Control messages never wait for credit or a pause.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field
from typing import Any

from . import messages
from .credits import CreditLedger, CreditSettings
from .envelope import (
    CLIENT_TYPES, CONTROL_TYPES, MAX_JSON_DEPTH, SERVER_TYPES, Message, byte_length,
    decode_json, encode, parse_envelope, validate_envelope, validate_payload,
)
from .errors import (
    ChannelPaused, CloseCode, DuplicateCallId, HandshakeRequired, InsufficientCredits,
    InvalidMessage, MaxRunsExceeded, MessageTooLarge, ProtoError, RateLimited,
    ReplayUnavailable, RunNotFound, UnsupportedType, UnsupportedVersion,
)
from .ratelimit import RateLimiter, Verdict
from .replay import ReplayWindow, ResendQueue
from .seen import SeenSeqs
from .traffic import INVALID, UNKNOWN_TYPE, TrafficCounters

# Bytes a stamped envelope adds around its payload (id, session, seq, ts, type, channel):
# the estimate the pending queue's byte count uses before the real encoding exists.
ENVELOPE_OVERHEAD = 160
#: Most bytes of replayed messages one ``take_writable`` returns: a replay is written out a
#: batch at a time, read from the window as it goes, never materialised whole.
REPLAY_BATCH_BYTES = 262144

PRE_HANDSHAKE_TYPES = frozenset({"HELLO", "PING"})


@dataclass(frozen=True, slots=True)
class SessionSettings:
    max_message_size: int = 1048576
    echo_messages: bool = True
    max_concurrent_runs: int = 10
    replay_window_size: int = 1000
    replay_window_time: int = 60000
    replay_window_bytes: int = 4194304  # the newest message is always kept, whatever its size
    heartbeat_interval: int = 30000
    heartbeat_timeout: int = 5000
    credits: CreditSettings = field(default_factory=CreditSettings)
    max_pending_messages: int = 10000
    outbound_buffer_size: int = 4194304  # unsent bytes before the client counts as stuck
    back_pressure_threshold: float = 0.8  # fraction of it at which USER is paused
    max_open_texts: int = 8
    max_text_size: int = 4194304  # UTF-8 bytes of one text's content, all its PARTs
    rate_limit: float = 1000.0  # upstream messages per second; 0 turns the limit off
    rate_limit_burst: int = 2000
    max_json_depth: int = MAX_JSON_DEPTH


# -- events handed to the application layer ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handshake:
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextReceived:
    message: dict[str, Any]  # wire form; END carries ``text`` and ``content_type`` too


@dataclass(frozen=True, slots=True)
class ToolCallReceived:
    call_id: str
    tool: str
    params: dict[str, Any]
    run_id: str | None
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCancelRequested:
    call_id: str


@dataclass(frozen=True, slots=True)
class ToolListRequested:
    pass


@dataclass(frozen=True, slots=True)
class RunChanged:
    kind: str  # "started" | "finished" | "cancelled"
    run: "Run"
    cancelled_calls: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AudioReceived:
    message: dict[str, Any]
    data: bytes


@dataclass(frozen=True, slots=True)
class ErrorSent:
    error: ProtoError


@dataclass(frozen=True, slots=True)
class CloseRequested:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatTimedOut:
    pass


@dataclass(frozen=True, slots=True)
class Expired:
    pass


@dataclass(frozen=True, slots=True)
class SlowConsumer:
    """Unsent bytes passed outbound_buffer_size: the transport should be dropped."""

    unsent_bytes: int


@dataclass(frozen=True, slots=True)
class SendRefused:
    """A server message was dropped: the pending queue was full (the client withholds
    credit or paused the channel for too long)."""

    type: str
    channel: str


Event = (Handshake | TextReceived | ToolCallReceived | ToolCancelRequested | ToolListRequested
         | RunChanged | AudioReceived | ErrorSent | CloseRequested | HeartbeatTimedOut | Expired
         | SlowConsumer | SendRefused)


# -- records ------------------------------------------------------------------------------------


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
class _Call:
    run_id: str | None
    message_id: str | None  # the TOOL_CALL's id; None for a call the application opened


@dataclass(slots=True)
class _Text:
    content_type: str
    parts: list[str]
    size: int = 0


class ProtocolSession:
    def __init__(self, session_id: str, user_id: str, settings: SessionSettings,
                 now: int, traffic: TrafficCounters | None = None) -> None:
        self.id = session_id
        self.user_id = user_id
        self.settings = settings
        self.last_activity = now
        self.connected = False
        self.disconnected_at: int | None = now
        self.handshake_completed = False
        self.closed = False  # expired or closed for good: no more sends

        self.up_seqs = SeenSeqs()  # upstream seqs seen: the highest, and gaps below it
        self.downstream_seq = 0
        self.last_ack = 0
        self.accept_events: frozenset[str] | None = None

        self.replay = ReplayWindow(settings.replay_window_size, settings.replay_window_time,
                                   settings.replay_window_bytes)
        self.rate = RateLimiter(settings.rate_limit, settings.rate_limit_burst, now)
        self._flooding = False  # closed for flooding: later messages are dropped silently
        self.credits = CreditLedger(settings.credits)
        self.paused_by_client: set[str] = set()
        self.paused_by_server: set[str] = set()
        # Lists, not deques: take_writable drains them whole, and an idle session's empty
        # list costs 56 bytes where a deque costs 760.
        self.pending: list[messages.Outbound] = []
        self._pending_sizes: list[int] = []
        # estimated encoded size of what ``pending`` holds, per channel
        self._pending_channel_bytes: dict[str, int] = {}
        self.in_flight = 0  # bytes the transport is writing right now
        # below this nothing in _check_pressure can trigger (half the pause threshold)
        self._low_water = min(settings.outbound_buffer_size * settings.back_pressure_threshold / 2,
                              settings.outbound_buffer_size)
        # back-pressure may pause USER only after data was queued since the last resume
        self._pause_armed = True
        self._overflowed = False
        self._resend = ResendQueue()  # window ranges to write again (resume, REPLAY_REQUEST)
        self._resend_bytes = 0  # what they hold; counts toward the outbound buffer

        self.texts: dict[str, _Text] = {}
        self.calls: dict[str, _Call] = {}
        self.runs: dict[str, Run] = {}

        self._counter = 0
        self._ping_nonce: str | None = None
        self._ping_sent_at = 0
        self._next_ping_at = now + settings.heartbeat_interval

        self._events: list[Event] = []
        # shared by every session of a server (the server's /metrics); own one otherwise
        self.traffic = traffic if traffic is not None else TrafficCounters()

    @property
    def upstream_seq(self) -> int:
        """The highest upstream seq seen."""
        return self.up_seqs.highest

    # -- connection lifecycle ------------------------------------------------------------

    def attach(self, now: int, last_seq: int | None = None) -> None:
        """A transport is (re)attached. With ``last_seq``, replay everything after it."""
        self.connected = True
        self.disconnected_at = None
        self.last_activity = now
        self._ping_nonce = None
        self._next_ping_at = now + self.settings.heartbeat_interval
        self._resend.clear()
        self._resend_bytes = 0
        self.in_flight = 0
        self._overflowed = False
        self._flooding = False
        if last_seq is not None:
            self._queue_replay(last_seq + 1, None, now, source="resume")

    def detach(self, now: int) -> None:
        self.connected = False
        self.disconnected_at = now
        self._ping_nonce = None
        self._resend.clear()  # a replay in progress was for that connection; a resume
        self._resend_bytes = 0  # asks for its own

    # -- upstream ------------------------------------------------------------------------

    def receive(self, raw: bytes | str, now: int) -> list[Event]:
        """One client frame / line / body element. Returns the events it caused."""
        if self._rate_limited(now):
            return self._take_events()
        try:
            msg = parse_envelope(raw, max_size=self.settings.max_message_size,
                                 max_depth=self.settings.max_json_depth)
        except MessageTooLarge as exc:
            self.traffic.received[INVALID] += 1
            self._fail(exc)
            self._events.append(CloseRequested(CloseCode.TOO_LARGE, "message too large"))
            return self._take_events()
        except ProtoError as exc:
            self.traffic.received[INVALID] += 1
            self._fail(exc)
            return self._take_events()
        return self.receive_message(msg, byte_length(raw), now)

    def receive_decoded(self, obj: Any, nbytes: int, now: int) -> list[Event]:
        """An element already decoded from a JSON array body."""
        if self._rate_limited(now):
            return self._take_events()
        try:
            msg = validate_envelope(obj, max_depth=self.settings.max_json_depth)
        except ProtoError as exc:
            self.traffic.received[INVALID] += 1
            self._fail(exc)
            return self._take_events()
        return self.receive_message(msg, nbytes, now)

    def _rate_limited(self, now: int) -> bool:
        """Take a token for one upstream message; without one the message is dropped
        unread (so its seq is not recorded and it may be resent as it was)."""
        verdict = self.rate.check(now)
        if verdict is Verdict.ALLOW:
            return False
        if not self._flooding:
            self._fail(RateLimited(
                f"more than {self.settings.rate_limit:g} messages per second (burst "
                f"{self.settings.rate_limit_burst}); message dropped",
                detail={"retry_after_ms": self.rate.retry_after_ms()}))
            if verdict is Verdict.CLOSE:
                self._flooding = True
                self._events.append(CloseRequested(CloseCode.POLICY_VIOLATION,
                                                   "rate limit exceeded"))
        return True

    def receive_message(self, msg: Message, nbytes: int, now: int) -> list[Event]:
        self.last_activity = now
        received = self.traffic.received  # inline: this runs for every message
        try:
            received[msg.type] += 1
        except KeyError:  # a type no client may send: one bounded label for all of them
            received[UNKNOWN_TYPE] += 1
        seen_before = self.up_seqs.highest
        if not self.up_seqs.first_time(msg.seq):
            return self._take_events()  # a retransmission: already seen
        charged = False
        try:
            if msg.type not in CLIENT_TYPES:
                raise UnsupportedType(f"unsupported message type {msg.type!r}")
            if not self.handshake_completed and msg.type not in PRE_HANDSHAKE_TYPES:
                raise HandshakeRequired()
            msg = validate_payload(msg)
            if msg.type not in CONTROL_TYPES:
                # refused before it is charged: a message the client must send again
                # must not cost it credit (nor earn it a top-up)
                if msg.channel in self.paused_by_server:
                    raise ChannelPaused(f"channel {msg.channel} is paused", related_id=msg.id)
                self.credits.charge(msg.channel, nbytes)
                charged = True
            self._process(msg, seen_before, now)
        except InsufficientCredits as exc:
            exc.related_id = exc.related_id or msg.id
            self._fail(exc)
            # refused for its size: top the bytes up so the client can send it again
            grant = self.credits.top_up_bytes(msg.channel, nbytes)
            if grant is not None:
                self.send(messages.flow_update(msg.channel, *grant))
        except ProtoError as exc:
            if exc.related_id is None:
                exc.related_id = msg.id
            self._fail(exc)
        if charged:
            # A message that spent credit is handled even when its handling ends in an
            # ERROR, so the channel is topped up either way (else a client whose last
            # credits went to rejected messages would wait for a FLOW_UPDATE forever).
            grant = self.credits.replenish(msg.channel, under_load=self._under_load())
            if grant is not None:
                self.send(messages.flow_update(msg.channel, *grant))
        return self._take_events()

    def _process(self, msg: Message, seen_before: int, now: int) -> None:
        handler = _HANDLERS[msg.type]
        handler(self, msg, seen_before, now)

    def _on_hello(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        if not set(p["accept_major"]) & set(messages.SUPPORTED_MAJORS):
            self._fail(UnsupportedVersion(
                f"server speaks major {list(messages.SUPPORTED_MAJORS)},"
                f" client accepts {p['accept_major'][:8]}", related_id=msg.id))
            self._events.append(CloseRequested(CloseCode.UNSUPPORTED_VERSION,
                                               "unsupported version"))
            return
        wanted = frozenset(p["accept_events"]) & SERVER_TYPES
        self.accept_events = wanted | {"HELLO", "ERROR", "PING"} if wanted else None
        fc = p["capabilities"].get("flow_control") if isinstance(p["capabilities"], dict) else None
        if not isinstance(fc, dict):
            fc = {}
        # Downstream credit only for a client that asks for it (docs/PROTOCOL.md §5.2):
        # one that merely announces initial_credit_messages is never stalled.
        self.credits.announce_client_credit(_positive_int(fc.get("initial_credit_messages")),
                                            _positive_int(fc.get("initial_credit_bytes")),
                                            downstream=fc.get("downstream") is True)
        first = not self.handshake_completed
        self.handshake_completed = True
        self.send(messages.hello(
            session_id=self.id,
            accept_events=self.accept_events or SERVER_TYPES,
            capabilities=self._capabilities(),
            last_client_seq=seen_before,
        ))
        if first:
            self._events.append(Handshake(p))

    def _capabilities(self) -> dict[str, Any]:
        s = self.settings
        return {
            "flow_control": {
                "enabled": s.credits.enabled,
                "initial_credit_messages": s.credits.initial_credit_messages,
                "initial_credit_bytes": s.credits.initial_credit_bytes,
            },
            "max_concurrent_runs": s.max_concurrent_runs,
            "replay_window": {"size": s.replay_window_size, "time_ms": s.replay_window_time},
            "heartbeat_interval_ms": s.heartbeat_interval,
            "max_message_size": s.max_message_size,
            # so a client can pace itself instead of learning the limit from RATE_LIMITED
            "rate_limit": {"messages_per_second": s.rate_limit, "burst": s.rate_limit_burst}
            if s.rate_limit else None,
            "max_json_depth": s.max_json_depth,
            "connect_ticket": True,  # POST /proto/ticket, then ?ticket= (docs/PROTOCOL.md)
        }

    def _on_ping(self, msg: Message, seen_before: int, now: int) -> None:
        self.send(messages.pong(msg.payload["nonce"]))

    def _on_pong(self, msg: Message, seen_before: int, now: int) -> None:
        if self._ping_nonce is not None and msg.payload["nonce"] == self._ping_nonce:
            self._ping_nonce = None

    def _on_text(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        mid = p["message_id"]
        wire = msg.to_wire()
        wire["payload"] = dict(p)
        if msg.type == "MESSAGE_START":
            if mid in self.texts:
                raise InvalidMessage(f"message_id {mid!r} is already open")
            if len(self.texts) >= self.settings.max_open_texts:
                raise InvalidMessage(f"too many open texts: {len(self.texts)} are started and "
                                     f"not ended (maxOpenTexts {self.settings.max_open_texts})")
            self.texts[mid] = _Text(p["content_type"], [])
            self._events.append(TextReceived(wire))
            return
        text = self.texts.get(mid)
        if text is None:
            raise InvalidMessage(f"unknown message_id {mid!r}")
        if msg.type == "MESSAGE_PART":
            content = p["content"]
            text.size += len(content) if content.isascii() else byte_length(content)
            if text.size > self.settings.max_text_size:
                del self.texts[mid]
                raise MessageTooLarge(f"text {mid!r} exceeds maxTextSize "
                                      f"({self.settings.max_text_size} bytes); it was "
                                      "discarded")
            text.parts.append(p["content"])
            self._events.append(TextReceived(wire))
            return
        del self.texts[mid]
        assembled = "".join(text.parts)
        wire["payload"]["text"] = assembled
        wire["payload"]["content_type"] = text.content_type
        self._events.append(TextReceived(wire))
        if self.settings.echo_messages:
            self.send_text(assembled, text.content_type)

    def _on_tool_call(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        call_id = p["call_id"]
        if call_id in self.calls:
            raise DuplicateCallId(f"call_id {call_id!r} is already running")
        run_id = p.get("run_id")
        self.calls[call_id] = _Call(run_id, msg.id)
        if run_id is not None and run_id not in self.runs:
            self.fail_call(call_id, RunNotFound(f"run {run_id!r} is not active in this session"))
            return
        self._events.append(ToolCallReceived(call_id, p["tool"], p["params"], run_id,
                                             msg.to_wire()))

    def _on_tool_cancel(self, msg: Message, seen_before: int, now: int) -> None:
        if msg.payload["call_id"] in self.calls:
            self._events.append(ToolCancelRequested(msg.payload["call_id"]))

    def _on_tool_list(self, msg: Message, seen_before: int, now: int) -> None:
        self._events.append(ToolListRequested())

    def _on_run_started(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        self.start_run(now, run_id=p.get("run_id"), thread_id=p.get("thread_id"),
                       metadata=p.get("metadata"))

    def _on_run_finished(self, msg: Message, seen_before: int, now: int) -> None:
        self.finish_run(msg.payload["run_id"], now, summary=msg.payload.get("summary"))

    def _on_run_cancel(self, msg: Message, seen_before: int, now: int) -> None:
        self.cancel_run(msg.payload["run_id"], now)

    def _on_ack(self, msg: Message, seen_before: int, now: int) -> None:
        seq = min(msg.payload["seq"], self.downstream_seq)
        if seq > self.last_ack:
            self.last_ack = seq
        self.replay.ack(seq)

    def _on_flow_update(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        self.credits.add_client_credit(p["channel"], p["add_messages"], p["add_bytes"])

    def _on_pause(self, msg: Message, seen_before: int, now: int) -> None:
        self.paused_by_client.add(msg.payload["channel"])

    def _on_resume(self, msg: Message, seen_before: int, now: int) -> None:
        self.paused_by_client.discard(msg.payload["channel"])

    def _on_replay_request(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        self._queue_replay(p["from_seq"], p["to_seq"], now, source="request",
                           related_id=msg.id)

    def _on_audio(self, msg: Message, seen_before: int, now: int) -> None:
        try:
            data = base64.b64decode(msg.payload["data"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMessage("AUDIO_CHUNK data is not valid base64") from None
        self._events.append(AudioReceived(msg.to_wire(), data))

    # -- runs (also the application's API) -----------------------------------------------

    def start_run(self, now: int, run_id: str | None = None, thread_id: str | None = None,
                  metadata: Any = None) -> Run:
        if len(self.runs) >= self.settings.max_concurrent_runs:
            raise MaxRunsExceeded(f"{len(self.runs)} runs are active"
                                  f" (max {self.settings.max_concurrent_runs})")
        if run_id is None:
            run_id = f"{self.id}-run{self._next()}"
        elif run_id in self.runs:
            raise InvalidMessage(f"run {run_id!r} is already active")
        run = Run(run_id, now, thread_id=thread_id, metadata=metadata)
        self.runs[run_id] = run
        self.send(messages.run_started(run_id, thread_id))
        self._events.append(RunChanged("started", run))
        return run

    def finish_run(self, run_id: str, now: int, summary: Any = None, error: Any = None) -> Run:
        run = self._pop_run(run_id, now)
        run.status = "error" if error is not None else "finished"
        run.summary, run.error = summary, error
        self.send(messages.run_finished(run_id, run.status, summary, error))
        self._events.append(RunChanged("finished", run))
        return run

    def cancel_run(self, run_id: str, now: int) -> Run:
        run = self._pop_run(run_id, now)
        run.status = "cancelled"
        calls = tuple(cid for cid, call in self.calls.items() if call.run_id == run_id)
        self.send(messages.run_finished(run_id, "cancelled"))
        self._events.append(RunChanged("cancelled", run, calls))
        return run

    def _pop_run(self, run_id: str, now: int) -> Run:
        run = self.runs.pop(run_id, None)
        if run is None:
            raise RunNotFound(f"run {run_id!r} is not active in this session")
        run.end_time = now
        return run

    # -- tool calls (the application's side) ---------------------------------------------

    def open_call(self, call_id: str, run_id: str | None = None) -> None:
        """A call the application starts itself (its agent calling a tool): from here on
        it is like a client's call, with TOOL_UPDATEs and exactly one TOOL_DONE, and
        cancelled with its run."""
        if call_id in self.calls:
            raise DuplicateCallId(f"call_id {call_id!r} is already running")
        if run_id is not None and run_id not in self.runs:
            raise RunNotFound(f"run {run_id!r} is not active in this session")
        self.calls[call_id] = _Call(run_id, None)

    def tool_update(self, call_id: str, status: str, progress: float | None = None,
                    partial: Any = None) -> bool:
        if call_id not in self.calls:
            return False
        return self.send(messages.tool_update(call_id, status, progress, partial))

    def tool_done(self, call_id: str, status: str, result: Any = None,
                  error: ProtoError | None = None) -> bool:
        """Finish a call with its single TOOL_DONE; False if it had already finished."""
        if self.calls.pop(call_id, None) is None:
            return False
        self.send(messages.tool_done(call_id, status, result, error))
        return True

    def fail_call(self, call_id: str, exc: ProtoError) -> bool:
        """TOOL_DONE ERROR with the error, plus the ERROR message (docs/PROTOCOL.md §4.4 Tools)."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        if exc.related_id is None:
            exc.related_id = call.message_id
        self.tool_done(call_id, "ERROR", error=exc)
        self._fail(exc)
        return True

    # -- downstream ----------------------------------------------------------------------

    def send(self, out: messages.Outbound) -> bool:
        """Queue a server message. False when filtered out, closed, or the queue is full."""
        if self.closed:
            return False
        if self.accept_events is not None and out.type not in self.accept_events:
            return False
        s = self.settings
        if len(self.pending) >= s.max_pending_messages or \
                self.pending_bytes >= max(s.outbound_buffer_size, 4 * s.max_message_size):
            if out.type not in CONTROL_TYPES:
                self._events.append(SendRefused(out.type, out.channel))
                return False
            # Control messages never wait for credit, so they are queued anyway; they
            # only pile up while a write is blocked, i.e. the client does not read: that
            # is a slow consumer (its transport is closed, the session kept, and what is
            # queued goes to the replay window), so nothing is lost.
            if self.connected and self.in_flight and not self._overflowed:
                self._overflowed = True
                self._events.append(SlowConsumer(self.unsent_bytes))
        self._enqueue(out)
        if out.type not in CONTROL_TYPES:
            self._pause_armed = True
        self._check_pressure()
        return True

    def _enqueue(self, out: messages.Outbound) -> None:
        size = len(encode(out.payload)) + ENVELOPE_OVERHEAD
        self.pending.append(out)
        self._pending_sizes.append(size)
        by_channel = self._pending_channel_bytes
        by_channel[out.channel] = by_channel.get(out.channel, 0) + size

    @property
    def pending_bytes(self) -> int:
        """Estimated encoded size of everything in ``pending`` (at most five channels)."""
        return sum(self._pending_channel_bytes.values())

    @property
    def unsent_bytes(self) -> int:
        """What the session holds for its client: queued, replays still to write, and
        being written."""
        return self.pending_bytes + self._resend_bytes + self.in_flight

    def set_in_flight(self, nbytes: int) -> None:
        """The transport reports how many bytes it is writing (0 once written)."""
        self.in_flight = nbytes
        self._check_pressure(writer=True)

    def _check_pressure(self, writer: bool = False, may_resume: bool = True) -> None:
        """Back-pressure (docs/PROTOCOL.md §5 Flow control), with hysteresis: USER is paused
        when the unsent bytes (queued plus being written) pass the high mark,
        backPressureThreshold of the buffer, and resumed only once they are down to the
        low mark, a quarter of the high one. Two rules keep the pair from feeding itself:
        a pause needs data queued since the last resume (the PAUSE/RESUME frames and the
        write of what is already queued never pause again on their own), and no resume is
        decided inside take_writable, between taking a batch off the queue and the
        transport reporting it in flight, when the batch is counted nowhere.

        A client is stuck when bytes the session could send (not held back by the client's
        own credit or pause) pass the whole buffer while a write is blocked: only another
        caller than the writer can see that."""
        s = self.settings
        unsent = self.unsent_bytes
        if unsent < self._low_water and not self.paused_by_server:
            return  # the common case: nearly nothing buffered
        high = s.outbound_buffer_size * s.back_pressure_threshold
        if s.credits.enabled:
            if "USER" not in self.paused_by_server:
                if unsent > high and self._pause_armed:
                    self.paused_by_server.add("USER")
                    self._enqueue(messages.pause_channel("USER"))
            elif may_resume and unsent <= high / 4:
                self.paused_by_server.discard("USER")
                self._pause_armed = False
                self._enqueue(messages.resume_channel("USER"))
        if writer or not self.in_flight or self._overflowed or not self.connected:
            return
        sendable = self.in_flight + self._resend_bytes + sum(
            nbytes for channel, nbytes in self._pending_channel_bytes.items()
            if nbytes and channel not in self.paused_by_client
            and self.credits.can_send(channel, 0))
        if sendable > s.outbound_buffer_size:
            self._overflowed = True
            self._events.append(SlowConsumer(sendable))

    def send_text(self, text: str, content_type: str = "text/plain") -> str:
        """START, PARTs, END on AGENT with a fresh message_id; returns the id. The text is
        split into as many PARTs as it takes for no envelope to exceed maxMessageSize."""
        mid = f"{self.id}-m{self._next()}"
        self.send(messages.text_start(mid, content_type))
        # what the stamped envelope adds around the payload: id and session hold the
        # session id, seq and ts at most 16 and 20 digits
        room = self.settings.max_message_size - (128 + 2 * len(self.id))
        for piece in messages.split_text(mid, text, room):
            self.send(messages.text_part(mid, piece))
        self.send(messages.text_end(mid))
        return mid

    def has_writable(self) -> bool:
        return bool(self._resend or self.pending)

    def take_writable(self, now: int) -> list[tuple[int, bytes]]:
        """Messages ready for the wire, in seq order: replays first, then pending
        messages whose channel has credit and is not paused (those get their seq now).

        A replay comes a batch of about REPLAY_BATCH_BYTES at a time, read from the
        window; until it is all taken nothing newer is, so the wire stays in seq order.
        Call again while ``has_writable()``."""
        if self._resend:
            out = self._resend.take(self.replay, REPLAY_BATCH_BYTES)
            self.traffic.replayed_messages += len(out)
            if self._resend:
                self._resend_bytes = self._resend.nbytes(self.replay)
                return out
            self._resend_bytes = 0
        else:
            out = []
        pending, sizes = self.pending, self._pending_sizes
        if not pending:
            return out
        self.pending, self._pending_sizes = [], []
        credits = self.credits
        paused = self.paused_by_client
        blocked: set[str] = set()
        sid, ts = self.id, str(now)
        sent = self.traffic.sent
        for ob, size in zip(pending, sizes, strict=True):
            channel = ob.channel
            control = ob.type in CONTROL_TYPES
            if not control and (channel in blocked or channel in paused):
                blocked.add(channel)
                self._hold(ob, size)
                continue
            seq = self.downstream_seq + 1
            data = encode({"id": ob.id or f"{sid}:{seq}", "session": sid, "seq": str(seq),
                           "ts": ts, "type": ob.type, "channel": channel,
                           "payload": ob.payload})
            if not control:
                if not credits.can_send(channel, len(data)):
                    blocked.add(channel)
                    self._hold(ob, size)
                    continue
                credits.spend(channel, len(data))
            self._pending_channel_bytes[channel] -= size
            self.downstream_seq = seq
            self.replay.add(seq, data, now)
            out.append((seq, data))
            try:
                sent[ob.type] += 1
            except KeyError:  # an application's own type
                sent[ob.type] = 1
        # what was just taken is not in flight yet: no resume decision here (see above)
        self._check_pressure(may_resume=False)
        return out

    def _hold(self, ob: messages.Outbound, size: int) -> None:
        """Put a message back, behind those held before it (order within a channel)."""
        self.pending.append(ob)
        self._pending_sizes.append(size)

    def _queue_replay(self, from_seq: int, to_seq: int | None, now: int, source: str,
                      related_id: str | None = None) -> None:
        """``source``: "resume" (a reconnect with last_seq) or "request" (REPLAY_REQUEST),
        for the replay counters."""
        replays = self.traffic.replays
        if to_seq is not None:
            to_seq = min(to_seq, self.downstream_seq)
        elif from_seq > self.downstream_seq:
            replays[source, "complete"] += 1  # nothing was sent after it
            return
        self.replay.prune(now)
        complete = self.replay.holds(from_seq)
        # merged with what is already queued: asking again for the same range costs
        # nothing, so the queue never holds more than the window
        self._resend.add(from_seq, self.downstream_seq if to_seq is None else to_seq)
        self._resend_bytes = self._resend.nbytes(self.replay)
        self._check_pressure()
        unavailable = not complete and (to_seq is None or from_seq <= to_seq)
        replays[source, "unavailable" if unavailable else "complete"] += 1
        if unavailable:
            first = self.replay.first_seq
            self._fail(ReplayUnavailable(
                f"messages from seq {from_seq} are no longer available",
                detail={"first_available": str(first if first is not None
                                                else self.downstream_seq + 1)},
                related_id=related_id))

    # -- time ----------------------------------------------------------------------------

    def tick(self, now: int) -> list[Event]:
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
                self.send(messages.ping(self._ping_nonce))
        elif not self.closed and self.disconnected_at is not None and \
                now - self.disconnected_at >= s.replay_window_time:
            self.closed = True
            self._events.append(Expired())
        self.replay.prune(now)
        return self._take_events()

    # -- helpers -------------------------------------------------------------------------

    def _fail(self, exc: ProtoError) -> None:
        """Send ERROR. Every ERROR costs the session a rate-limit token, like a message
        received (RATE_LIMITED itself excepted): a client whose messages all fail gets
        half the rate, and keeps flooding with them at its peril."""
        if not isinstance(exc, RateLimited):
            self.rate.charge()
        self.send(messages.error(exc))
        self._events.append(ErrorSent(exc))

    def _under_load(self) -> bool:
        return bool(self.paused_by_server) or \
            len(self.pending) > self.settings.max_pending_messages // 2

    def _next(self) -> int:
        self._counter += 1
        return self._counter

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def has_events(self) -> bool:
        return bool(self._events)

    def take_events(self) -> list[Event]:
        """Events caused outside ``receive`` / ``tick`` (tool results, app calls)."""
        return self._take_events()

    def reject(self, exc: ProtoError) -> None:
        """Report a problem found outside the core (by a transport) as an ERROR; the
        message it was about counts as an invalid one received."""
        self.traffic.received[INVALID] += 1
        self._fail(exc)

    def snapshot(self) -> dict[str, Any]:
        """The session fields (docs/PROTOCOL.md §12), with live values (plain data, camelCase)."""
        up = self.credits.upstream()
        return {
            "id": self.id,
            "userId": self.user_id,
            "connected": self.connected,
            "handshakeCompleted": self.handshake_completed,
            "lastActivity": self.last_activity,
            "credits": {ch: m for ch, (m, _) in up.items()},
            "byteCredits": {ch: b for ch, (_, b) in up.items()},
            "downstreamCredits": {ch: m for ch, (m, _) in self.credits.downstream().items()},
            "pausedChannels": set(self.paused_by_client | self.paused_by_server),
            "lastAck": str(self.last_ack),
            "lastDeliveredSeq": str(self.downstream_seq),
            "lastClientSeq": str(self.upstream_seq),
            "replayWindow": {str(e.seq): decode_json(e.data) for e in self.replay},
            "activeRuns": set(self.runs),
            "pendingMessages": {str(i): ob.to_dict() for i, ob in enumerate(self.pending)},
            "outboundBytes": self.unsent_bytes,
        }


_HANDLERS = {
    "HELLO": ProtocolSession._on_hello,
    "PING": ProtocolSession._on_ping,
    "PONG": ProtocolSession._on_pong,
    "MESSAGE_START": ProtocolSession._on_text,
    "MESSAGE_PART": ProtocolSession._on_text,
    "MESSAGE_END": ProtocolSession._on_text,
    "TOOL_CALL": ProtocolSession._on_tool_call,
    "TOOL_CANCEL": ProtocolSession._on_tool_cancel,
    "TOOL_LIST": ProtocolSession._on_tool_list,
    "RUN_STARTED": ProtocolSession._on_run_started,
    "RUN_FINISHED": ProtocolSession._on_run_finished,
    "RUN_CANCEL": ProtocolSession._on_run_cancel,
    "ACK": ProtocolSession._on_ack,
    "FLOW_UPDATE": ProtocolSession._on_flow_update,
    "PAUSE_CHANNEL": ProtocolSession._on_pause,
    "RESUME_CHANNEL": ProtocolSession._on_resume,
    "REPLAY_REQUEST": ProtocolSession._on_replay_request,
    "AUDIO_CHUNK": ProtocolSession._on_audio,
}


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value
