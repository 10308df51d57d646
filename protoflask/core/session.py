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

import base64
import binascii
from typing import Any, Callable

from .calls import Run
from .credits import CreditLedger
from .envelope import (
    CLIENT_TYPES, CONTROL_TYPES, SERVER_TYPES, Message, byte_length, parse_envelope,
    validate_envelope, validate_payload,
)
from .errors import (
    ChannelPaused, CloseCode, HandshakeRequired, InsufficientCredits, InvalidMessage,
    MessageTooLarge, ProtoError, RateLimited, UnsupportedType, UnsupportedVersion,
)
from .events import (
    AudioReceived, CloseRequested, ErrorSent, Event, Expired, Handshake, HeartbeatTimedOut,
    RunChanged, SendRefused, SlowConsumer, TextReceived, ToolCallReceived, ToolCancelRequested,
    ToolListRequested,
)
from .hello import (
    PRE_HANDSHAKE_TYPES, accepted_events, asked_extensions, capabilities, client_flow_control,
    version_refused,
)
from .messages import (
    Outbound, error as error_message, flow_update, hello as hello_message,
    ping as ping_message, pong as pong_message,
)
from .meter import Meter
from .parts import SessionParts
from .outbound import OutboundQueue
from .ratelimit import Verdict, limiter
from .settings import SessionSettings
from .state import RESET_STEPS, TRANSITIONS, SessionState, Transition
from .texts import outgoing_text
from .traffic import INVALID, UNKNOWN_TYPE, TrafficCounters

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
_NO_EXTENSIONS: frozenset[str] = frozenset()  # one for all: each frozenset() is 216 bytes


def _attached() -> bool:
    """The outbound queue's ``connected`` while a transport is attached (``_to`` sets it:
    the session starts detached)."""
    return True


def _detached() -> bool:
    return False


class ProtocolSession(SessionParts):
    """Slotted, and the parts most sessions never use made on first use (parts.py)."""

    __slots__ = ("id", "user_id", "_state", "last_activity", "disconnected_at",
                 "last_ack", "accept_events", "extensions", "rate", "credits",
                 "traffic", "events", "outbound", "meter", "id_counter",
                 "__weakref__")  # (an adapter keeps its state per session, weakly: agui)

    def __init__(self, session_id: str, user_id: str, settings: SessionSettings,
                 now: int, traffic: TrafficCounters | None = None, *,
                 greeted: bool = False) -> None:
        """``greeted``: the handshake was completed already (a session moved from another
        node)."""
        SessionParts.__init__(self, settings, now)  # the settings, the heartbeat's start
        self.id = session_id
        self.user_id = user_id
        self._state = SessionState.DETACHED if greeted else SessionState.NEW
        self.last_activity = now
        self.disconnected_at: int | None = now

        self.last_ack = 0
        self.accept_events: frozenset[str] | None = None
        #: the protocol extensions the client asked for in its first HELLO (hello.py)
        self.extensions = _NO_EXTENSIONS
        self.rate = limiter(settings.rate_limit, settings.rate_limit_burst, now)
        self.credits = CreditLedger(settings.credits)
        # shared by every session of a server (the server's /metrics); own one otherwise
        self.traffic = traffic if traffic is not None else TrafficCounters()
        #: the events buffered since the last ``take_events`` (the one way out; read it,
        #: or ``has_events()``, to know whether there are any)
        self.events: list[Event] = []
        self.outbound = OutboundQueue(session_id, settings, self.credits, self.traffic,
                                      self.events, _detached)
        #: what the client made this session hold beyond its window (texts, calls, runs)
        self.meter = self.outbound.meter = Meter()
        #: the last number used in an id this session made (message and run ids); it
        #: moves with the session so that ids never repeat
        self.id_counter = 0

    def has_writable(self) -> bool:
        """Whether messages are ready for the wire (the transports ask the queue itself:
        ``outbound.has_writable``)."""
        return self.outbound.has_writable()

    def take_writable(self, now: int) -> list[tuple[int, bytes]]:
        """Messages ready for the wire, in seq order (``OutboundQueue.take_writable``)."""
        return self.outbound.take_writable(now)

    # -- state ----------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    def _to(self, transition: Transition) -> None:
        before = self._state
        after = self._state = TRANSITIONS[before][transition]
        for part, flag, value in RESET_STEPS[transition]:  # the state beside the table
            setattr(getattr(self, part), flag, value)
        if (before in _ATTACHED) is not (after in _ATTACHED):  # the shared running count
            attached = after in _ATTACHED
            self.traffic.attached += 1 if attached else -1
            # what the queue asks (``connected``), shared functions: no bound method kept
            self.outbound._connected = _attached if attached else _detached

    @property
    def connected(self) -> bool:
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

    # -- connection lifecycle ------------------------------------------------------------

    def attach(self, now: int, last_seq: int | None = None) -> None:
        """A transport is (re)attached. With ``last_seq``, replay everything after it."""
        self._to(Transition.ATTACH)
        self.disconnected_at = None
        self.last_activity = now
        self.restart(now)  # the heartbeat's (its base)
        self.outbound.drop_resends()  # a fresh connection: nothing to resend yet
        if last_seq is not None:
            self._queue_replay(last_seq + 1, None, now, source="resume")

    def detach(self, now: int) -> None:
        self._to(Transition.DETACH)
        self.disconnected_at = now
        self.outbound.drop_resends()

    # -- upstream: rules 0 and 1, then receive_message ---------------------------------

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
            self.events.append(CloseRequested(CloseCode.TOO_LARGE, "message too large"))
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
        refusal = self.rate.refusal(verdict)
        if refusal is not None:
            self._fail(refusal)
            if self.rate.flooding:
                self.events.append(CloseRequested(CloseCode.POLICY_VIOLATION,
                                                   "rate limit exceeded"))

    def reject(self, exc: ProtoError) -> None:
        """Report a problem found outside the core (by a transport) as an ERROR; the
        message it was about counts as an invalid one received."""
        self.traffic.received[INVALID] += 1
        self._fail(exc)

    def receive_message(self, msg: Message, nbytes: int, now: int) -> None:
        """A message whose envelope is valid (rules 2 to 8)."""
        self.last_activity = now
        mtype = msg.type
        received = self.traffic.received  # inline: this runs for every message
        try:
            received[mtype] += 1
        except KeyError:  # a type no client may send: one bounded label for all of them
            received[UNKNOWN_TYPE] += 1
        seen_before = self.highest  # the upstream seqs seen (seen.py: the session's base)
        if not self.first_time(msg.seq):
            return  # a retransmission: already seen
        charged = False
        try:
            if mtype not in CLIENT_TYPES:
                raise UnsupportedType(f"unsupported message type {mtype!r}")
            if mtype not in PRE_HANDSHAKE_TYPES and not self.handshake_completed:
                raise HandshakeRequired()
            msg = validate_payload(msg)
            if mtype not in CONTROL_TYPES:
                # refused before it is charged: a message the client must send again
                # must not cost it credit (nor earn it a top-up)
                if msg.channel in self.outbound.paused_by_server:
                    raise ChannelPaused(f"channel {msg.channel} is paused", related_id=msg.id)
                self.credits.charge(msg.channel, nbytes)
                charged = True
            _HANDLERS[mtype](self, msg, seen_before, now)
        except InsufficientCredits as exc:
            exc.related_id = exc.related_id or msg.id
            self._fail(exc)
            # refused for its size: top the bytes up so the client can send it again
            grant = self.credits.top_up_bytes(msg.channel, nbytes)
            if grant is not None:
                self.send(flow_update(msg.channel, *grant))
        except ProtoError as exc:
            if exc.related_id is None:
                exc.related_id = msg.id
            self._fail(exc)
        if charged:
            # A message that spent credit is handled even when its handling ends in an
            # ERROR, so the channel is topped up either way (else a client whose last
            # credits went to rejected messages would wait for a FLOW_UPDATE forever).
            grant = self.credits.replenish(msg.channel, under_load=self.outbound.under_load())
            if grant is not None:
                self.send(flow_update(msg.channel, *grant))

    def _on_hello(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        refused = version_refused(p)
        if refused is not None:
            self._fail(UnsupportedVersion(refused, related_id=msg.id))
            self.events.append(CloseRequested(CloseCode.UNSUPPORTED_VERSION,
                                               "unsupported version"))
            return
        self.accept_events = accepted_events(p)
        self.credits.announce_client_credit(*client_flow_control(p))
        first = not self.handshake_completed
        if first:  # the session's first HELLO decides its extensions, for its whole life
            asked = asked_extensions(p)
            if asked is not None:
                self.extensions = asked
        self._to(Transition.HELLO)
        self.send(hello_message(
            session_id=self.id,
            accept_events=self.accept_events or SERVER_TYPES,
            capabilities=capabilities(self.settings, self.extensions),
            last_client_seq=seen_before,
        ))
        if first:
            self.events.append(Handshake(p))

    def _on_ping(self, msg: Message, seen_before: int, now: int) -> None:
        self.send(pong_message(msg.payload["nonce"]))

    def _on_pong(self, msg: Message, seen_before: int, now: int) -> None:
        self.answered(msg.payload["nonce"])

    def _on_text(self, msg: Message, seen_before: int, now: int) -> None:
        """MESSAGE_START, PART, END: assembled by ``texts`` (texts.py), each reported."""
        p = msg.payload
        mid = p["message_id"]
        wire = msg.to_wire()
        wire["payload"] = payload = dict(p)
        mtype = msg.type
        if mtype == "MESSAGE_START":
            self.texts.start(mid, p["content_type"])
        elif mtype == "MESSAGE_PART":
            self.texts.add(mid, p["content"])
        else:
            assembled, content_type = self.texts.end(mid)
            payload["text"], payload["content_type"] = assembled, content_type
            self.events.append(TextReceived(wire))
            if self.settings.echo_messages:
                self.send_text(assembled, content_type)
            return
        self.events.append(TextReceived(wire))

    _on_message_start = _on_message_part = _on_message_end = _on_text

    def _on_tool_call(self, msg: Message, seen_before: int, now: int) -> None:
        self.work.call_received(msg)

    def _on_tool_cancel(self, msg: Message, seen_before: int, now: int) -> None:
        self.work.cancel_received(msg.payload["call_id"])

    def _on_tool_list(self, msg: Message, seen_before: int, now: int) -> None:
        self.events.append(ToolListRequested())

    def _on_run_started(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        self.work.start_run(now, run_id=p.get("run_id"), thread_id=p.get("thread_id"),
                            metadata=p.get("metadata"))

    def _on_run_finished(self, msg: Message, seen_before: int, now: int) -> None:
        self.work.finish_run(msg.payload["run_id"], now, summary=msg.payload.get("summary"))

    def _on_run_cancel(self, msg: Message, seen_before: int, now: int) -> None:
        self.work.cancel_run(msg.payload["run_id"], now)

    def _on_ack(self, msg: Message, seen_before: int, now: int) -> None:
        seq = min(msg.payload["seq"], self.outbound.downstream_seq)
        if seq > self.last_ack:
            self.last_ack = seq
        self.outbound.replay.ack(seq)

    def _on_flow_update(self, msg: Message, seen_before: int,
                        now: int) -> None:
        p = msg.payload
        self.credits.add_client_credit(p["channel"], p["add_messages"], p["add_bytes"])

    def _on_pause_channel(self, msg: Message, seen_before: int, now: int) -> None:
        self.outbound.pause_by_client(msg.payload["channel"])

    def _on_resume_channel(self, msg: Message, seen_before: int, now: int) -> None:
        self.outbound.resume_by_client(msg.payload["channel"])

    def _on_replay_request(self, msg: Message, seen_before: int,
                           now: int) -> None:
        p = msg.payload
        self._queue_replay(p["from_seq"], p["to_seq"], now, source="request",
                           related_id=msg.id)

    def _on_audio_chunk(self, msg: Message, seen_before: int, now: int) -> None:
        try:
            data = base64.b64decode(msg.payload["data"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMessage("AUDIO_CHUNK data is not valid base64") from None
        self.events.append(AudioReceived(msg.to_wire(), data))

    # -- downstream (the queue is outbound.py) -------------------------------------------

    def send(self, out: Outbound) -> bool:
        """Queue a server message. False when filtered out, closed, or the queue is full."""
        if self._state is _CLOSED:
            return False
        if self.accept_events is not None and out.type not in self.accept_events:
            return False
        return self.outbound.push(out)

    def send_text(self, text: str, content_type: str = "text/plain") -> str:
        """START, PARTs, END on AGENT with a fresh message_id (texts.py); returns the id."""
        mid = f"{self.id}-m{self._next()}"
        for out in outgoing_text(mid, text, content_type, self.settings, self.id):
            self.send(out)
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
        if self.connected:
            nonce, timed_out = self.beat(now)
            if nonce is not None:
                self.send(ping_message(nonce))
            elif timed_out:
                self.events.append(HeartbeatTimedOut())
        elif not self.closed and self.disconnected_at is not None and \
                now - self.disconnected_at >= self.settings.replay_window_time:
            self._to(Transition.CLOSE)
            self.events.append(Expired())
        self.outbound.replay.prune(now)

    # -- events: the one way out ---------------------------------------------------------

    def has_events(self) -> bool:
        return bool(self.events)

    def take_events(self) -> list[Event]:
        """Every event caused since the last call (by receive, tick, sends, tool results,
        the application's calls), oldest first."""
        events = self.events
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
        self.events.append(ErrorSent(exc))

    def _next(self) -> int:
        self.id_counter += 1
        return self.id_counter


#: message type -> its handler, ``_on_<type>``
_HANDLERS: dict[str, Callable[[ProtocolSession, Message, int, int], None]] = {
    mtype: getattr(ProtocolSession, f"_on_{mtype.lower()}") for mtype in CLIENT_TYPES}
