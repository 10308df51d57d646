"""Envelope parsing and encoding: bytes/str -> Message, Message -> bytes.

The envelope (docs/PROTOCOL.md §2) and every client payload (§4) are validated
with marshmallow schemas built once at import. Extra envelope fields are
ignored and extra payload fields are kept, so newer clients stay compatible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson
from marshmallow import EXCLUDE, INCLUDE, Schema, ValidationError, fields, validate

from .errors import InvalidMessage, MessageTooLarge, MissingRunId, UnsupportedType

CHANNELS = ("SYSTEM", "USER", "AGENT", "AUDIO_IN", "AUDIO_OUT")

#: Types that never need or spend credit and are allowed on any channel (docs/PROTOCOL.md §5).
CONTROL_TYPES = frozenset({
    "HELLO", "PING", "PONG", "ACK", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL",
    "REPLAY_REQUEST", "ERROR",
})

#: Every type name a client may send.
CLIENT_TYPES = frozenset({
    "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_CALL",
    "TOOL_CANCEL", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "RUN_CANCEL", "ACK",
    "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL", "REPLAY_REQUEST", "AUDIO_CHUNK",
})

#: Every type name the server sends.
SERVER_TYPES = frozenset({
    "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_UPDATE",
    "TOOL_DONE", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "FLOW_UPDATE", "PAUSE_CHANNEL",
    "RESUME_CHANNEL", "ERROR", "AUDIO_CHUNK",
})

#: Longest decimal string accepted for a ts. Python refuses to convert strings of
#: more than 4300 digits (a ValueError no schema expects), and no clock needs more than 20.
MAX_DIGITS = 64
#: Largest seq anywhere (the envelope's, every payload seq field, the last_seq query):
#: 2^53-1, exact in a JavaScript number and storable as an int64 by every layer (orjson,
#: Redis, the dashboard). INVALID_MESSAGE beyond.
MAX_SEQ = 2 ** 53 - 1
SEQ_DIGITS = len(str(MAX_SEQ))  # 16
#: Validation reports at most this many errors per list (then stops looking): a payload
#: with 250k bad elements costs five checks and a small ERROR, not 250k of each.
MAX_VALIDATION_ERRORS = 5
#: Deepest JSON nesting accepted in an envelope (the envelope object is level 1, its
#: payload level 2). orjson itself refuses more than 1024 levels on reading and encodes
#: at most 254, so anything a client nests is cut well before either (maxJsonDepth).
MAX_JSON_DEPTH = 64

_POSITIVE_INT = re.compile(r"[1-9][0-9]{0,%d}\Z" % (SEQ_DIGITS - 1), re.ASCII)
_NON_NEGATIVE_INT = re.compile(r"(0|[1-9][0-9]{0,%d})\Z" % (SEQ_DIGITS - 1), re.ASCII)
_SEQ_ERROR = f"must be a decimal string of a number of at most {MAX_SEQ} (2^53-1)"
_DECIMAL = re.compile(r"[0-9]{1,%d}\Z" % MAX_DIGITS, re.ASCII)


@dataclass(frozen=True, slots=True)
class Message:
    """One validated envelope. ``seq`` and ``ts`` are ints here, strings on the wire."""

    id: str
    session: str
    seq: int
    ts: int
    type: str
    channel: str
    payload: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session": self.session,
            "seq": str(self.seq),
            "ts": str(self.ts),
            "type": self.type,
            "channel": self.channel,
            "payload": self.payload,
        }


def encode(wire: Mapping[str, Any]) -> bytes:
    """A wire dict as compact JSON bytes.

    Non-string dict keys become strings (JSON has no others): marshmallow reports list
    errors keyed by index, and those land in ERROR ``detail``.
    """
    return orjson.dumps(wire, option=orjson.OPT_NON_STR_KEYS)


def decode_json(raw: bytes | bytearray | memoryview | str) -> Any:
    """Bytes or text as JSON, or InvalidMessage."""
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None


# -- field types ---------------------------------------------------------------------------


class SeqField(fields.Field[int]):
    """A seq number in a payload: a decimal string or an int (docs/PROTOCOL.md §2) -> int."""

    def __init__(self, *, allow_zero: bool = True, **kwargs: Any) -> None:
        self.allow_zero = allow_zero
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool):
            raise ValidationError("must be a decimal string or an integer")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and _NON_NEGATIVE_INT.match(value):
            number = int(value)
        else:
            raise ValidationError(f"{_SEQ_ERROR}, or an integer")
        if number < 0 or (number == 0 and not self.allow_zero):
            raise ValidationError("must be a positive number")
        if number > MAX_SEQ:
            raise ValidationError(f"must be at most {MAX_SEQ} (2^53-1)")
        return number


class StrictInt(fields.Integer):
    """An integer that refuses booleans and strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _validated(self, value: Any) -> int:
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._validated(value)


class BoundedList(fields.List[Any]):
    """A list whose validation stops after MAX_VALIDATION_ERRORS bad elements (marshmallow's
    List checks and reports every one)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.make_error("invalid")
        result: list[Any] = []
        errors: dict[Any, Any] = {}
        for idx, each in enumerate(value):
            try:
                result.append(self.inner.deserialize(each, **kwargs))
            except ValidationError as error:
                errors[idx] = error.messages
                if len(errors) >= MAX_VALIDATION_ERRORS and idx + 1 < len(value):
                    errors["more"] = (f"validation stopped after {MAX_VALIDATION_ERRORS} "
                                      f"errors; the list has {len(value)} elements")
                    break
        if errors:
            raise ValidationError(errors, valid_data=result)
        return result


def _seq_string(value: str) -> None:
    if not _POSITIVE_INT.match(value) or int(value) > MAX_SEQ:
        raise ValidationError(f"must be a positive decimal string of a number of at most "
                              f"{MAX_SEQ} (2^53-1)")


def _required_str(**kwargs: Any) -> fields.String:
    return fields.String(required=True, validate=validate.Length(min=1), **kwargs)


def _channel(**kwargs: Any) -> fields.String:
    return fields.String(validate=validate.OneOf(CHANNELS), **kwargs)


class _Payload(Schema):
    class Meta:
        unknown = INCLUDE


# -- envelope --------------------------------------------------------------------------------


class EnvelopeSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    id = _required_str()
    session = fields.String(required=True)
    seq = fields.String(required=True, validate=_seq_string)
    ts = fields.String(required=True, validate=validate.Regexp(
        _DECIMAL, error=f"must be a decimal string of at most {MAX_DIGITS} digits"))
    type = fields.String(required=True)
    channel = fields.String(required=True, validate=validate.OneOf(CHANNELS))
    payload = fields.Dict(required=True)


# -- payloads (client to server, docs/PROTOCOL.md §4) ---------------------------------


_VERSION = re.compile(r"\d+\.\d+\.\d+\Z")


class HelloPayload(_Payload):
    proto_version = fields.String(required=True, validate=validate.Regexp(
        _VERSION, error="must look like major.minor.patch"))
    accept_major = BoundedList(StrictInt(), required=True)
    accept_events = BoundedList(fields.String(), load_default=list)
    capabilities = fields.Dict(load_default=dict)


class NoncePayload(_Payload):
    nonce = fields.String(required=True)


class MessageStartPayload(_Payload):
    message_id = _required_str()
    content_type = fields.String(required=True)


class MessagePartPayload(_Payload):
    message_id = _required_str()
    content = fields.String(required=True)


class MessageEndPayload(_Payload):
    message_id = _required_str()


class ToolCallPayload(_Payload):
    call_id = _required_str()
    tool = _required_str()
    params = fields.Dict(required=True)
    run_id = fields.String(load_default=None, allow_none=True)


class CallIdPayload(_Payload):
    call_id = _required_str()


class EmptyPayload(_Payload):
    pass


class RunStartedPayload(_Payload):
    run_id = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1))
    thread_id = fields.String(load_default=None, allow_none=True)
    metadata = fields.Raw(load_default=None, allow_none=True)


class RunFinishedPayload(_Payload):
    run_id = _required_str()
    summary = fields.Raw(load_default=None, allow_none=True)


class RunCancelPayload(_Payload):
    run_id = _required_str()


class AckPayload(_Payload):
    seq = SeqField(required=True)


class FlowUpdatePayload(_Payload):
    channel = _channel(required=True)
    add_messages = StrictInt(load_default=0, validate=validate.Range(min=0))
    add_bytes = StrictInt(load_default=0, validate=validate.Range(min=0))


class ChannelPayload(_Payload):
    channel = _channel(required=True)


class ReplayRequestPayload(_Payload):
    from_seq = SeqField(required=True, allow_zero=False)
    to_seq = SeqField(load_default=None, allow_none=True, allow_zero=False)


class AudioChunkPayload(_Payload):
    message_id = _required_str()
    mime = fields.String(required=True)
    data = fields.String(required=True)
    final = fields.Boolean(load_default=False)


PAYLOAD_SCHEMAS: dict[str, Schema] = {
    "HELLO": HelloPayload(),
    "PING": NoncePayload(),
    "PONG": NoncePayload(),
    "MESSAGE_START": MessageStartPayload(),
    "MESSAGE_PART": MessagePartPayload(),
    "MESSAGE_END": MessageEndPayload(),
    "TOOL_CALL": ToolCallPayload(),
    "TOOL_CANCEL": CallIdPayload(),
    "TOOL_LIST": EmptyPayload(),
    "RUN_STARTED": RunStartedPayload(),
    "RUN_FINISHED": RunFinishedPayload(),
    "RUN_CANCEL": RunCancelPayload(),
    "ACK": AckPayload(),
    "FLOW_UPDATE": FlowUpdatePayload(),
    "PAUSE_CHANNEL": ChannelPayload(),
    "RESUME_CHANNEL": ChannelPayload(),
    "REPLAY_REQUEST": ReplayRequestPayload(),
    "AUDIO_CHUNK": AudioChunkPayload(),
}
assert set(PAYLOAD_SCHEMAS) == CLIENT_TYPES

_ENVELOPE = EnvelopeSchema()


def parse(raw: bytes | bytearray | memoryview | str, *, max_size: int | None = None,
          max_depth: int = MAX_JSON_DEPTH) -> Message:
    """Validate one client envelope and its payload (docs/PROTOCOL.md §2, §4) into a Message."""
    return validate_payload(parse_envelope(raw, max_size=max_size, max_depth=max_depth))


def parse_envelope(raw: bytes | bytearray | memoryview | str, *,
                   max_size: int | None = None, max_depth: int = MAX_JSON_DEPTH) -> Message:
    """Validate the envelope only; the payload stays the raw dict.

    Raises MessageTooLarge or InvalidMessage (marshmallow's errors in ``detail``,
    ``related_id`` set whenever the envelope had a usable ``id``).
    """
    if max_size is not None:
        size = byte_length(raw)
        if size > max_size:
            raise MessageTooLarge(f"message of {size} bytes exceeds {max_size}")
    return validate_envelope(decode_json(raw), max_depth=max_depth)


def byte_length(raw: bytes | bytearray | memoryview | str) -> int:
    """The size of a frame in bytes; text counts as its UTF-8 encoding (docs/PROTOCOL.md §2, §5)."""
    if isinstance(raw, str):
        return len(raw.encode("utf-8", "surrogatepass"))
    if isinstance(raw, memoryview):
        return raw.nbytes
    return len(raw)


def validate_envelope(obj: Any, *, max_depth: int = MAX_JSON_DEPTH) -> Message:
    """An already decoded JSON value as an envelope (payload not yet validated)."""
    if not isinstance(obj, dict):
        raise InvalidMessage("an envelope must be a JSON object")
    msg = _accept_envelope(obj)
    if msg is None:
        msg = _load_envelope(obj)
    if max_depth >= 2 and not any(map(_CONTAINERS.__contains__, map(type, msg.payload.values()))):
        return msg  # a flat payload (most are) nests two levels: no walk needed
    if _nested_deeper_than(msg.payload, max_depth - 1):
        raise InvalidMessage(f"JSON nested deeper than {max_depth} levels",
                             related_id=msg.id)
    return msg


def _nested_deeper_than(value: dict[str, Any], limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels below and including ``value``
    (no recursion: a hostile depth must not cost stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        for child in container.values() if type(container) is dict else container:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def _load_envelope(obj: dict[str, Any]) -> Message:
    """The envelope through its marshmallow schema: the definition, and every error."""
    try:
        env = _ENVELOPE.load(obj)
    except ValidationError as exc:
        raw_id = obj.get("id")
        raise InvalidMessage("invalid envelope", detail=exc.messages,
                             related_id=raw_id if isinstance(raw_id, str) and raw_id else None
                             ) from None
    return Message(
        id=env["id"], session=env["session"], seq=int(env["seq"]), ts=int(env["ts"]),
        type=env["type"], channel=env["channel"], payload=env["payload"],
    )


def validate_payload(msg: Message) -> Message:
    """The message with its payload validated for its type.

    Raises UnsupportedType, MissingRunId or InvalidMessage.
    """
    accept = _ACCEPT_PAYLOAD.get(msg.type)
    if accept is not None:
        payload = accept(msg.payload)
        if payload is msg.payload:  # accepted as it is: the decoded dict is the message's own
            return msg
        if payload is not None:
            return Message(msg.id, msg.session, msg.seq, msg.ts, msg.type, msg.channel, payload)
    return _load_payload(msg)


def _load_payload(msg: Message) -> Message:
    """The payload through its marshmallow schema: the definition, and every error."""
    schema = PAYLOAD_SCHEMAS.get(msg.type)
    if schema is None:
        raise UnsupportedType(f"unsupported message type {msg.type!r}", related_id=msg.id)
    try:
        payload = schema.load(msg.payload)
    except ValidationError as exc:
        errors = exc.messages
        if msg.type in ("RUN_FINISHED", "RUN_CANCEL") and "run_id" not in msg.payload:
            raise MissingRunId(f"{msg.type} needs run_id", related_id=msg.id) from None
        raise InvalidMessage(f"invalid {msg.type} payload", detail=errors,
                             related_id=msg.id) from None
    return Message(msg.id, msg.session, msg.seq, msg.ts, msg.type, msg.channel, payload)


# -- the fast path ------------------------------------------------------------------------------
#
# The schemas above define what is valid and word every error. For the envelope and the
# payloads a busy session sends most (PING, PONG, text, TOOL_CALL) the checks below accept
# exactly what the schemas accept and build the same result, in a fraction of the time;
# anything they do not accept goes through the schema, which then reports the error.
# tests/core/test_fastpath.py holds the two to the same answers. A check returns the payload
# itself when the schema would load it unchanged (the message is then kept as it is).

_CHANNEL_SET = frozenset(CHANNELS)
_CONTAINERS = frozenset((dict, list))


def _accept_envelope(obj: dict[str, Any]) -> Message | None:
    try:
        mid, session, seq, ts = obj["id"], obj["session"], obj["seq"], obj["ts"]
        mtype, channel, payload = obj["type"], obj["channel"], obj["payload"]
    except KeyError:
        return None
    if (type(mid) is str and mid and type(session) is str and type(seq) is str
            and type(ts) is str and type(mtype) is str and type(channel) is str
            and type(payload) is dict and channel in _CHANNEL_SET
            and _POSITIVE_INT.match(seq) and _DECIMAL.match(ts)):
        number = int(seq)
        if number <= MAX_SEQ:
            return Message(mid, session, number, int(ts), mtype, channel, payload)
    return None


def _accept_nonce(p: dict[str, Any]) -> dict[str, Any] | None:
    return p if type(p.get("nonce")) is str else None


def _id_ok(value: Any) -> bool:
    return type(value) is str and value != ""


def _accept_start(p: dict[str, Any]) -> dict[str, Any] | None:
    return p if _id_ok(p.get("message_id")) and type(p.get("content_type")) is str else None


def _accept_part(p: dict[str, Any]) -> dict[str, Any] | None:
    return p if _id_ok(p.get("message_id")) and type(p.get("content")) is str else None


def _accept_end(p: dict[str, Any]) -> dict[str, Any] | None:
    return p if _id_ok(p.get("message_id")) else None


def _accept_tool_call(p: dict[str, Any]) -> dict[str, Any] | None:
    run_id = p.get("run_id")
    if (_id_ok(p.get("call_id")) and _id_ok(p.get("tool")) and type(p.get("params")) is dict
            and (run_id is None or type(run_id) is str)):
        if "run_id" not in p:  # the schema's load_default, written into the decoded dict
            p["run_id"] = None  # (the message's own): no copy, no second Message
        return p
    return None


def _accept_hello(p: dict[str, Any]) -> dict[str, Any] | None:
    """HELLO: checked in C-speed loops, so even a huge valid list costs little."""
    version, major = p.get("proto_version"), p.get("accept_major")
    events = p.get("accept_events", [])
    caps = p.get("capabilities", {})
    if (type(version) is str and _VERSION.match(version) and type(major) is list
            and all(type(v) is int for v in major) and type(events) is list
            and all(type(e) is str for e in events) and type(caps) is dict):
        out = dict(p)
        out["accept_major"], out["accept_events"] = list(major), list(events)
        out["capabilities"] = dict(caps)
        return out
    return None


_ACCEPT_PAYLOAD = {
    "HELLO": _accept_hello,
    "PING": _accept_nonce,
    "PONG": _accept_nonce,
    "MESSAGE_START": _accept_start,
    "MESSAGE_PART": _accept_part,
    "MESSAGE_END": _accept_end,
    "TOOL_CALL": _accept_tool_call,
}
