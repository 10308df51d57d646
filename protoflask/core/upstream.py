"""The receive pipeline of a session: one validated client message, checked against the
session's rules (the list at the top of session.py) and handled by its type.

``UpstreamHandlers`` is mixed into ``ProtocolSession``; its methods are the session's.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from sys import getsizeof
from typing import TYPE_CHECKING, Any, Callable

from .messages import (
    Outbound, SUPPORTED_MAJORS, flow_update, hello as hello_message, pong as pong_message,
)
from .envelope import (
    CLIENT_TYPES, CONTROL_TYPES, SERVER_TYPES, Message, byte_length,
    validate_payload,
)
from .errors import (
    ChannelPaused, CloseCode, HandshakeRequired, InsufficientCredits, InvalidMessage,
    MessageTooLarge, ProtoError, RunNotFound, UnsupportedType, UnsupportedVersion,
)
from .events import (
    AudioReceived, CloseRequested, Handshake, TextReceived, ToolCallReceived,
    ToolCancelRequested, ToolListRequested,
)
from .meter import Meter, OverBudget
from .settings import SessionSettings
from .traffic import UNKNOWN_TYPE

if TYPE_CHECKING:
    from .calls import CallRegistry, Run
    from .credits import CreditLedger
    from .events import Event
    from .outbound import OutboundQueue
    from .seen import SeenSeqs
    from .traffic import TrafficCounters

PRE_HANDSHAKE_TYPES = frozenset({"HELLO", "PING"})
#: Protocol extensions a client may ask for in its first HELLO
#: (``capabilities.extensions``, docs/PROTOCOL.md §3): "agui", AG-UI events on the socket.
EXTENSIONS = frozenset({"agui"})


@dataclass(slots=True)
class Text:
    """A text being received: its START came, its END not yet."""

    content_type: str
    parts: list[str]
    size: int = 0  # UTF-8 bytes, against maxTextSize (the protocol's measure)
    memory: int = 0  # what the parts cost in memory (a str of one non-Latin-1 character
    # is 2 or 4 bytes a character): the session's byte budget counts this


def capabilities(s: SessionSettings) -> dict[str, Any]:
    """What the server's HELLO announces of the session's settings."""
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


class UpstreamHandlers:
    """The handlers, one per client message type. What they use of the session is
    declared here; ``ProtocolSession`` provides it."""

    id: str
    settings: SessionSettings
    last_activity: int
    last_ack: int
    accept_events: frozenset[str] | None
    extensions: frozenset[str]
    traffic: TrafficCounters
    up_seqs: SeenSeqs
    credits: CreditLedger
    outbound: OutboundQueue
    registry: CallRegistry
    meter: Meter
    texts: dict[str, Text]
    _events: list[Event]
    _ping_nonce: str | None

    if TYPE_CHECKING:
        @property
        def handshake_completed(self) -> bool: ...
        def send(self, out: Outbound) -> bool: ...
        def send_text(self, text: str, content_type: str = ...) -> str: ...
        def start_run(self, now: int, run_id: str | None = ..., thread_id: str | None = ...,
                      metadata: Any = ...) -> Run: ...
        def finish_run(self, run_id: str, now: int, summary: Any = ...,
                       error: Any = ...) -> Run: ...
        def cancel_run(self, run_id: str, now: int) -> Run: ...
        def fail_call(self, call_id: str, exc: ProtoError) -> bool: ...
        def _fail(self, exc: ProtoError) -> None: ...
        def _greeted(self) -> None: ...
        def _under_load(self) -> bool: ...
        def _queue_replay(self, from_seq: int, to_seq: int | None, now: int, source: str,
                          related_id: str | None = ...) -> None: ...

    def receive_message(self, msg: Message, nbytes: int, now: int) -> None:
        """A message whose envelope is valid (rules 2 to 8)."""
        self.last_activity = now
        mtype = msg.type
        received = self.traffic.received  # inline: this runs for every message
        try:
            received[mtype] += 1
        except KeyError:  # a type no client may send: one bounded label for all of them
            received[UNKNOWN_TYPE] += 1
        seen = self.up_seqs
        seen_before = seen.highest
        if not seen.first_time(msg.seq):
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
            grant = self.credits.replenish(msg.channel, under_load=self._under_load())
            if grant is not None:
                self.send(flow_update(msg.channel, *grant))

    def _on_hello(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        if not set(p["accept_major"]) & set(SUPPORTED_MAJORS):
            self._fail(UnsupportedVersion(
                f"server speaks major {list(SUPPORTED_MAJORS)},"
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
        if first:  # the session's first HELLO decides its extensions, for its whole life
            asked = p["capabilities"].get("extensions") \
                if isinstance(p["capabilities"], dict) else None
            if isinstance(asked, list):
                self.extensions = EXTENSIONS.intersection(
                    e for e in asked[:16] if isinstance(e, str))
        self._greeted()
        caps = capabilities(self.settings)
        if self.extensions:  # answered only to a client that asked: the ones it has
            caps["extensions"] = sorted(self.extensions)
        self.send(hello_message(
            session_id=self.id,
            accept_events=self.accept_events or SERVER_TYPES,
            capabilities=caps,
            last_client_seq=seen_before,
        ))
        if first:
            self._events.append(Handshake(p))

    def _on_ping(self, msg: Message, seen_before: int, now: int) -> None:
        self.send(pong_message(msg.payload["nonce"]))

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
            self.texts[mid] = Text(p["content_type"], [])
            self._events.append(TextReceived(wire))
            return
        text = self.texts.get(mid)
        if text is None:
            raise InvalidMessage(f"unknown message_id {mid!r}")
        if msg.type == "MESSAGE_PART":
            content = p["content"]
            text.size += len(content) if content.isascii() else byte_length(content)
            if text.size > self.settings.max_text_size:
                self._drop_text(mid)
                raise MessageTooLarge(f"text {mid!r} exceeds maxTextSize "
                                      f"({self.settings.max_text_size} bytes); it was "
                                      "discarded")
            cost = getsizeof(content)
            try:
                self.meter.charge(cost)
            except OverBudget as exc:
                self._drop_text(mid)
                raise MessageTooLarge(f"text {mid!r} was discarded: {exc}") from None
            text.parts.append(content)
            text.memory += cost
            self._events.append(TextReceived(wire))
            return
        self._drop_text(mid)
        assembled = "".join(text.parts)
        wire["payload"]["text"] = assembled
        wire["payload"]["content_type"] = text.content_type
        self._events.append(TextReceived(wire))
        if self.settings.echo_messages:
            self.send_text(assembled, text.content_type)

    def _drop_text(self, mid: str) -> None:
        """An open text ends (assembled or discarded): its parts' bytes are given back."""
        self.meter.release(self.texts.pop(mid).memory)

    def _on_tool_call(self, msg: Message, seen_before: int, now: int) -> None:
        p = msg.payload
        call_id = p["call_id"]
        run_id = p.get("run_id")
        self.registry.add_call(call_id, run_id, msg.id)
        if run_id is not None and run_id not in self.registry.runs:
            self.fail_call(call_id, RunNotFound(f"run {run_id!r} is not active in this session"))
            return
        try:  # its params are held until its TOOL_DONE (queued calls' too)
            self.registry.charge_call(call_id, p["params"])
        except ProtoError as exc:
            self.fail_call(call_id, exc)
            return
        self._events.append(ToolCallReceived(call_id, p["tool"], p["params"], run_id, msg))

    def _on_tool_cancel(self, msg: Message, seen_before: int,
                        now: int) -> None:
        if msg.payload["call_id"] in self.registry.calls:
            self._events.append(ToolCancelRequested(msg.payload["call_id"]))

    def _on_tool_list(self, msg: Message, seen_before: int, now: int) -> None:
        self._events.append(ToolListRequested())

    def _on_run_started(self, msg: Message, seen_before: int,
                        now: int) -> None:
        p = msg.payload
        self.start_run(now, run_id=p.get("run_id"), thread_id=p.get("thread_id"),
                       metadata=p.get("metadata"))

    def _on_run_finished(self, msg: Message, seen_before: int,
                         now: int) -> None:
        self.finish_run(msg.payload["run_id"], now, summary=msg.payload.get("summary"))

    def _on_run_cancel(self, msg: Message, seen_before: int, now: int) -> None:
        self.cancel_run(msg.payload["run_id"], now)

    def _on_ack(self, msg: Message, seen_before: int, now: int) -> None:
        seq = min(msg.payload["seq"], self.outbound.downstream_seq)
        if seq > self.last_ack:
            self.last_ack = seq
        self.outbound.replay.ack(seq)

    def _on_flow_update(self, msg: Message, seen_before: int,
                        now: int) -> None:
        p = msg.payload
        self.credits.add_client_credit(p["channel"], p["add_messages"], p["add_bytes"])

    def _on_pause(self, msg: Message, seen_before: int, now: int) -> None:
        self.outbound.paused_by_client.add(msg.payload["channel"])

    def _on_resume(self, msg: Message, seen_before: int, now: int) -> None:
        self.outbound.paused_by_client.discard(msg.payload["channel"])

    def _on_replay_request(self, msg: Message, seen_before: int,
                           now: int) -> None:
        p = msg.payload
        self._queue_replay(p["from_seq"], p["to_seq"], now, source="request",
                           related_id=msg.id)

    def _on_audio(self, msg: Message, seen_before: int, now: int) -> None:
        try:
            data = base64.b64decode(msg.payload["data"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMessage("AUDIO_CHUNK data is not valid base64") from None
        self._events.append(AudioReceived(msg.to_wire(), data))


_Handler = Callable[[UpstreamHandlers, Message, int, int], None]
_HANDLERS: dict[str, _Handler] = {
    "HELLO": UpstreamHandlers._on_hello,
    "PING": UpstreamHandlers._on_ping,
    "PONG": UpstreamHandlers._on_pong,
    "MESSAGE_START": UpstreamHandlers._on_text,
    "MESSAGE_PART": UpstreamHandlers._on_text,
    "MESSAGE_END": UpstreamHandlers._on_text,
    "TOOL_CALL": UpstreamHandlers._on_tool_call,
    "TOOL_CANCEL": UpstreamHandlers._on_tool_cancel,
    "TOOL_LIST": UpstreamHandlers._on_tool_list,
    "RUN_STARTED": UpstreamHandlers._on_run_started,
    "RUN_FINISHED": UpstreamHandlers._on_run_finished,
    "RUN_CANCEL": UpstreamHandlers._on_run_cancel,
    "ACK": UpstreamHandlers._on_ack,
    "FLOW_UPDATE": UpstreamHandlers._on_flow_update,
    "PAUSE_CHANNEL": UpstreamHandlers._on_pause,
    "RESUME_CHANNEL": UpstreamHandlers._on_resume,
    "REPLAY_REQUEST": UpstreamHandlers._on_replay_request,
    "AUDIO_CHUNK": UpstreamHandlers._on_audio,
}


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value
