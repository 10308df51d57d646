"""Envelope parsing and encoding: bytes/str -> Message, Message -> bytes.

The envelope (docs/PROTOCOL.md §2) and every client payload (§4) are validated by the
marshmallow schemas of schemas.py, which define what is valid and word every error; the
fast checks at the end of this module accept the common messages the schemas accept, for
a fraction of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, compress
from typing import Any, Callable, Mapping

import orjson
from marshmallow import ValidationError

from .errors import InvalidMessage, MessageTooLarge, MissingRunId, UnsupportedType
from .schemas import ENVELOPE_SCHEMA, PAYLOAD_SCHEMAS
from .wire import MAX_DIGITS, MAX_NONCE_LENGTH, VERSION
# the type sets and bounds are this module's interface too (explicit re-exports)
from .wire import CHANNELS as CHANNELS, CLIENT_TYPES as CLIENT_TYPES
from .wire import CONTROL_TYPES as CONTROL_TYPES, SERVER_TYPES as SERVER_TYPES
from .wire import MAX_JSON_DEPTH as MAX_JSON_DEPTH, MAX_SEQ as MAX_SEQ, SEQ_DIGITS as SEQ_DIGITS


@dataclass(slots=True)
class Message:
    """One validated envelope. ``seq`` and ``ts`` are ints here, strings on the wire.

    Not frozen (nothing assigns to one after it is built): one is built for every message
    received, and a frozen one cost three times as much to build (every field set
    through a slot descriptor's ``__set__`` or ``object.__setattr__``, docs/PERFORMANCE.md
    p5-ping). Its payload was never frozen either."""

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


#: orjson's options for the wire (the outbound queue calls orjson with them directly)
ENCODING = orjson.OPT_NON_STR_KEYS


def encode(wire: Mapping[str, Any]) -> bytes:
    """A wire dict as compact JSON bytes.

    Non-string dict keys become strings (JSON has no others): marshmallow reports list
    errors keyed by index, and those land in ERROR ``detail``.
    """
    return orjson.dumps(wire, option=ENCODING)


def decode_json(raw: bytes | bytearray | memoryview | str) -> Any:
    """Bytes or text as JSON, or InvalidMessage."""
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None


def parse(raw: bytes | bytearray | memoryview | str, *, max_size: int | None = None,
          max_depth: int = MAX_JSON_DEPTH) -> Message:
    """Validate one client envelope and its payload (docs/PROTOCOL.md §2, §4) into a Message."""
    return validate_payload(parse_envelope(raw, max_size=max_size, max_depth=max_depth))


def parse_envelope_plain(raw: bytes | bytearray | memoryview | str, *,
                         max_size: int | None = None, max_depth: int = MAX_JSON_DEPTH,
                         size: int | None = None) -> Message:
    """Validate the envelope only; the payload stays the raw dict. ``size``: the caller's
    ``byte_length(raw)``, if it has it.

    Raises MessageTooLarge or InvalidMessage (marshmallow's errors in ``detail``,
    ``related_id`` set whenever the envelope had a usable ``id``).

    The definition: the size, then ``decode_json``, then ``validate_envelope``.
    ``parse_envelope_fast`` does the same with the two calls written out (this runs for
    every message); ``parse_envelope`` below is the one the server uses.
    """
    if max_size is not None:
        if size is None:
            size = byte_length(raw)
        if size > max_size:
            raise MessageTooLarge(f"message of {size} bytes exceeds {max_size}")
    return validate_envelope(decode_json(raw), max_depth=max_depth)


def parse_envelope_fast(raw: bytes | bytearray | memoryview | str, *,
                        max_size: int | None = None, max_depth: int = MAX_JSON_DEPTH,
                        size: int | None = None) -> Message:
    """``parse_envelope_plain``, with ``decode_json`` and ``validate_envelope``'s common
    case inline. tests/core/test_fastpath.py's TestParseEnvelope runs over both."""
    if max_size is not None:
        if size is None:
            size = byte_length(raw)
        if size > max_size:
            raise MessageTooLarge(f"message of {size} bytes exceeds {max_size}")
    try:  # decode_json, inline
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None
    if type(obj) is dict:  # validate_envelope's common case, inline
        msg = _accept_envelope(obj)
        if msg is not None:
            if max_depth >= 2:  # as in validate_envelope
                for value in msg.payload.values():
                    if type(value) is dict or type(value) is list:
                        break
                else:
                    return msg
                # one level of small containers holding none (a TOOL_CALL's params):
                # three levels with the envelope, told without the counts below (two
                # scans of the frame: 2.4k instructions a tool call, the tool row of
                # docs/PERFORMANCE.md, branch tool7)
                if max_depth >= 3:
                    for value in msg.payload.values():
                        kind = type(value)
                        if kind is dict:
                            if len(value) > FLAT_CONTAINER:
                                break
                            value = value.values()
                        elif kind is list:
                            if len(value) > FLAT_CONTAINER:
                                break
                        else:
                            continue
                        for item in value:
                            if type(item) is dict or type(item) is list:
                                break
                        else:
                            continue
                        break
                    else:
                        return msg
                # no deeper than it has containers (the envelope one of them): a HELLO's
                # few need no walk (what the counts find inside strings only adds)
                if type(raw) is bytes and raw.count(b"{") + raw.count(b"[") <= max_depth:
                    return msg
            return _depth_checked(msg, max_depth)
    return validate_envelope(obj, max_depth=max_depth)


#: A payload's dict or list of at most this many items is looked into by
#: ``parse_envelope_fast`` for containers (more: the frame's counts, then the walk)
FLAT_CONTAINER = 32


#: The swap point: the implementation every caller gets (parse_envelope_plain serves the
#: same answers, a little slower).
parse_envelope = parse_envelope_fast


def byte_length(raw: bytes | bytearray | memoryview | str) -> int:
    """The size of a frame in bytes; text counts as its UTF-8 encoding (docs/PROTOCOL.md §2, §5)."""
    if type(raw) is bytes:  # the common case first: a WebSocket frame, a body line
        return len(raw)
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
    if max_depth >= 2:  # a flat payload (most are) nests two levels: no walk needed
        for value in msg.payload.values():  # (a loop: half the cost of any(map(...)))
            if type(value) is dict or type(value) is list:
                break
        else:
            return msg
    return _depth_checked(msg, max_depth)


def _depth_checked(msg: Message, max_depth: int) -> Message:
    if _nested_deeper_than(msg.payload, max_depth - 1):
        raise InvalidMessage(f"JSON nested deeper than {max_depth} levels",
                             related_id=msg.id)
    return msg


def _nested_deeper_than(value: dict[str, Any], limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels below and including ``value``
    (no recursion: a hostile depth must not cost stack).

    One container at a time for the common small payload; past WALK_ONE_BY_ONE
    containers, a level at a time (``_levels_deeper_than``): a payload of 300,000 ``{}``
    took over a second of the worker one by one (issue 24)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    walked = 0
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        walked += len(container)  # children about to be looked at
        if walked > WALK_ONE_BY_ONE:
            return _levels_deeper_than(value, limit)
        for child in container.values() if type(container) is dict else container:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


WALK_ONE_BY_ONE = 256


def _levels_deeper_than(value: dict[str, Any], limit: int) -> bool:
    """``_nested_deeper_than`` a level at a time, each level's children sorted out by C
    iterators (``map``, ``compress``, ``chain``) rather than a Python loop over each:
    about a tenth of the time on a list of many small containers."""
    level: list[Any] = [value]
    depth = 1
    while level:
        if depth > limit:
            return True
        level = list(filter(None, level))  # an empty container has no level below
        kinds = list(map(type, level))
        dicts = compress(level, map(_IS_DICT, kinds))
        children = list(chain(chain.from_iterable(map(dict.values, dicts)),
                              chain.from_iterable(compress(level, map(_IS_LIST, kinds)))))
        level = list(compress(children, map(_IS_CONTAINER, map(type, children))))
        depth += 1
    return False


_IS_DICT = frozenset({dict}).__contains__
_IS_LIST = frozenset({list}).__contains__
_IS_CONTAINER = frozenset({dict, list}).__contains__


def _load_envelope(obj: dict[str, Any]) -> Message:
    """The envelope through its marshmallow schema: the definition, and every error."""
    try:
        env = ENVELOPE_SCHEMA.load(obj)
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
    accept = PAYLOAD_CHECKS.get(msg.type)
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


def _accept_envelope(obj: dict[str, Any]) -> Message | None:
    try:
        mid, session, seq, ts = obj["id"], obj["session"], obj["seq"], obj["ts"]
        mtype, channel, payload = obj["type"], obj["channel"], obj["payload"]
    except KeyError:
        return None
    if (type(mid) is str and mid and type(session) is str and type(seq) is str
            and type(ts) is str and type(mtype) is str and type(channel) is str
            and type(payload) is dict and channel in _CHANNEL_SET
            # POSITIVE_INT and DECIMAL, in string methods (half a regex match's cost)
            and seq.isdigit() and seq.isascii() and len(seq) <= SEQ_DIGITS and seq[0] != "0"
            and ts.isdigit() and ts.isascii() and len(ts) <= MAX_DIGITS):
        number = int(seq)
        if number <= MAX_SEQ:
            return Message(mid, session, number, int(ts), mtype, channel, payload)
    return None


def _accept_nonce(p: dict[str, Any]) -> dict[str, Any] | None:
    nonce = p.get("nonce")
    return p if type(nonce) is str and len(nonce) <= MAX_NONCE_LENGTH else None


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
    """HELLO: checked in C-speed loops, so even a huge valid list costs little. Accepted,
    the decoded dict itself (the message's own: no copy of it, its lists and its
    capabilities, no second Message), the schema's defaults written into it."""
    version, major = p.get("proto_version"), p.get("accept_major")
    events = p.get("accept_events", _NO_EVENTS)
    caps = p.get("capabilities", _NO_CAPS)
    if (type(version) is str and VERSION.match(version) and type(major) is list
            and all(type(v) is int for v in major) and type(events) is list
            and all(type(e) is str for e in events) and type(caps) is dict):
        if events is _NO_EVENTS:
            p["accept_events"] = []
        if caps is _NO_CAPS:
            p["capabilities"] = {}
        return p
    return None


_NO_EVENTS: list[str] = []  # _accept_hello's markers of a key left out: never handed on
_NO_CAPS: dict[str, Any] = {}


#: type -> the fast check of its payload: the payload itself when the schema would load it
#: unchanged, another one when it would change it, None when only the schema can tell
PAYLOAD_CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
    "HELLO": _accept_hello,
    "PING": _accept_nonce,
    "PONG": _accept_nonce,
    "MESSAGE_START": _accept_start,
    "MESSAGE_PART": _accept_part,
    "MESSAGE_END": _accept_end,
    "TOOL_CALL": _accept_tool_call,
}
