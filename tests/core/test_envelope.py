"""Envelope and payload validation (docs/PROTOCOL.md §2, §4, §6)."""

from __future__ import annotations

import json

import orjson
import pytest

from protoflask.core import errors
from protoflask.core.errors import InvalidMessage
from protoflask.core.envelope import (
    CHANNELS, CLIENT_TYPES, CONTROL_TYPES, Message, decode_json, encode, parse, parse_envelope,
    validate_envelope, validate_payload,
)

from ._support import envelope, raw

# -- every client type with a valid payload (docs/PROTOCOL.md §4) --------------------------------

VALID_PAYLOADS = {
    "HELLO": {"proto_version": "1.1.2", "accept_major": [1], "accept_events": ["PONG"],
              "capabilities": {"flow_control": {"initial_credit_messages": 10,
                                                "initial_credit_bytes": 4096}}},
    "PING": {"nonce": "n-1"},
    "PONG": {"nonce": "n-2"},
    "MESSAGE_START": {"message_id": "m1", "content_type": "text/plain"},
    "MESSAGE_PART": {"message_id": "m1", "content": "hello"},
    "MESSAGE_END": {"message_id": "m1"},
    "TOOL_CALL": {"call_id": "c1", "tool": "add", "params": {"a": 1, "b": 2}, "run_id": "r1"},
    "TOOL_CANCEL": {"call_id": "c1"},
    "TOOL_LIST": {},
    "RUN_STARTED": {"run_id": "r1", "thread_id": "t1", "metadata": {"k": [1, 2]}},
    "RUN_FINISHED": {"run_id": "r1", "summary": "done"},
    "RUN_CANCEL": {"run_id": "r1"},
    "ACK": {"seq": "7"},
    "FLOW_UPDATE": {"channel": "AGENT", "add_messages": 5, "add_bytes": 100},
    "PAUSE_CHANNEL": {"channel": "AGENT"},
    "RESUME_CHANNEL": {"channel": "AGENT"},
    "REPLAY_REQUEST": {"from_seq": "3", "to_seq": "9"},
    "AUDIO_CHUNK": {"message_id": "a1", "mime": "audio/wav", "data": "AAEC", "final": True},
}

#: Optional fields may be omitted (docs/PROTOCOL.md §4 marks them with ``?``).
MINIMAL_PAYLOADS = {
    "HELLO": {"proto_version": "1.1.2", "accept_major": [1]},
    "TOOL_CALL": {"call_id": "c1", "tool": "echo", "params": {}},
    "RUN_STARTED": {},
    "RUN_FINISHED": {"run_id": "r1"},
    "FLOW_UPDATE": {"channel": "USER"},
    "REPLAY_REQUEST": {"from_seq": "1"},
    "AUDIO_CHUNK": {"message_id": "a1", "mime": "audio/wav", "data": ""},
}


def test_tables_cover_every_client_type_of_the_contract():
    contract_types = {
        "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_CALL",
        "TOOL_CANCEL", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "RUN_CANCEL", "ACK",
        "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL", "REPLAY_REQUEST", "AUDIO_CHUNK",
    }
    assert set(VALID_PAYLOADS) == contract_types
    assert CLIENT_TYPES == contract_types


def test_control_types_match_contract_5():
    assert CONTROL_TYPES == {"HELLO", "PING", "PONG", "ACK", "FLOW_UPDATE", "PAUSE_CHANNEL",
                             "RESUME_CHANNEL", "REPLAY_REQUEST", "ERROR"}


def test_channels_match_contract_1():
    assert set(CHANNELS) == {"SYSTEM", "USER", "AGENT", "AUDIO_IN", "AUDIO_OUT"}


@pytest.mark.parametrize("mtype", sorted(VALID_PAYLOADS))
def test_every_client_type_parses(mtype):
    payload = VALID_PAYLOADS[mtype]
    msg = parse(raw(mtype, payload, seq="42", ts="1700000000123", id="abc"))
    assert isinstance(msg, Message)
    assert (msg.id, msg.session, msg.seq, msg.ts, msg.type) == (
        "abc", "sess-1", 42, 1700000000123, mtype)
    for key, value in payload.items():
        if key in ("seq", "from_seq", "to_seq"):
            assert msg.payload[key] == int(value)
        else:
            assert msg.payload[key] == value


@pytest.mark.parametrize("mtype", sorted(MINIMAL_PAYLOADS))
def test_optional_payload_fields_may_be_omitted(mtype):
    msg = parse(raw(mtype, MINIMAL_PAYLOADS[mtype]))
    assert msg.type == mtype


def test_optional_fields_get_neutral_defaults():
    assert parse(raw("HELLO", MINIMAL_PAYLOADS["HELLO"])).payload["accept_events"] == []
    assert parse(raw("TOOL_CALL", MINIMAL_PAYLOADS["TOOL_CALL"])).payload["run_id"] is None
    assert parse(raw("RUN_STARTED", {})).payload["run_id"] is None
    fu = parse(raw("FLOW_UPDATE", {"channel": "USER"})).payload
    assert (fu["add_messages"], fu["add_bytes"]) == (0, 0)
    assert parse(raw("REPLAY_REQUEST", {"from_seq": "4"})).payload["to_seq"] is None
    assert parse(raw("AUDIO_CHUNK", MINIMAL_PAYLOADS["AUDIO_CHUNK"])).payload["final"] is False


def test_extra_payload_fields_are_kept_and_extra_envelope_fields_ignored():
    msg = parse(raw("PING", {"nonce": "x", "future": 1}, extra_field="zzz"))
    assert msg.payload == {"nonce": "x", "future": 1}
    assert "extra_field" not in msg.to_wire()


def test_known_type_on_another_valid_channel_is_accepted():
    # docs/PROTOCOL.md §4: "The server does not reject a known type on another valid channel."
    assert parse(raw("PING", {"nonce": "x"}, channel="USER")).channel == "USER"
    assert parse(raw("MESSAGE_START", VALID_PAYLOADS["MESSAGE_START"],
                     channel="SYSTEM")).channel == "SYSTEM"


# -- bad payloads -> INVALID_MESSAGE ----------------------------------------------------------

INVALID_PAYLOADS = [
    ("HELLO", {"accept_major": [1]}),                                   # no proto_version
    ("HELLO", {"proto_version": "1.1.2"}),                              # no accept_major
    ("HELLO", {"proto_version": 1, "accept_major": [1]}),
    ("HELLO", {"proto_version": "1.1", "accept_major": [1]}),
    ("HELLO", {"proto_version": "1.1.2", "accept_major": 1}),
    ("HELLO", {"proto_version": "1.1.2", "accept_major": ["1"]}),
    ("HELLO", {"proto_version": "1.1.2", "accept_major": [True]}),
    ("HELLO", {"proto_version": "1.1.2", "accept_major": [1], "accept_events": "PONG"}),
    ("HELLO", {"proto_version": "1.1.2", "accept_major": [1], "capabilities": []}),
    ("PING", {}),
    ("PING", {"nonce": 5}),
    ("PONG", {"nonce": None}),
    ("MESSAGE_START", {"message_id": "m1"}),
    ("MESSAGE_START", {"content_type": "text/plain"}),
    ("MESSAGE_START", {"message_id": "", "content_type": "text/plain"}),
    ("MESSAGE_PART", {"message_id": "m1"}),
    ("MESSAGE_PART", {"message_id": "m1", "content": 3}),
    ("MESSAGE_END", {}),
    ("MESSAGE_END", {"message_id": 7}),
    ("TOOL_CALL", {"tool": "echo", "params": {}}),
    ("TOOL_CALL", {"call_id": "c1", "params": {}}),
    ("TOOL_CALL", {"call_id": "c1", "tool": "echo"}),
    ("TOOL_CALL", {"call_id": "c1", "tool": "echo", "params": [1]}),
    ("TOOL_CALL", {"call_id": "c1", "tool": "echo", "params": {}, "run_id": 5}),
    ("TOOL_CANCEL", {}),
    ("RUN_STARTED", {"run_id": 3}),
    ("RUN_STARTED", {"run_id": ""}),
    ("RUN_FINISHED", {"run_id": 3}),
    ("RUN_CANCEL", {"run_id": ["r1"]}),
    ("ACK", {}),
    ("ACK", {"seq": "abc"}),
    ("ACK", {"seq": "-1"}),
    ("ACK", {"seq": -1}),
    ("ACK", {"seq": 1.5}),
    ("ACK", {"seq": True}),
    ("ACK", {"seq": None}),
    ("FLOW_UPDATE", {}),
    ("FLOW_UPDATE", {"channel": "NOPE"}),
    ("FLOW_UPDATE", {"channel": "USER", "add_messages": -1}),
    ("FLOW_UPDATE", {"channel": "USER", "add_messages": "5"}),
    ("FLOW_UPDATE", {"channel": "USER", "add_bytes": True}),
    ("PAUSE_CHANNEL", {}),
    ("PAUSE_CHANNEL", {"channel": "user"}),
    ("RESUME_CHANNEL", {"channel": 1}),
    ("REPLAY_REQUEST", {}),
    ("REPLAY_REQUEST", {"from_seq": "x"}),
    ("REPLAY_REQUEST", {"from_seq": "1", "to_seq": "y"}),
    ("REPLAY_REQUEST", {"from_seq": 2.0}),
    ("AUDIO_CHUNK", {"message_id": "a1", "mime": "audio/wav"}),
    ("AUDIO_CHUNK", {"message_id": "a1", "data": "AA=="}),
    ("AUDIO_CHUNK", {"mime": "audio/wav", "data": "AA=="}),
]


@pytest.mark.parametrize("mtype,payload", INVALID_PAYLOADS,
                         ids=[f"{t}-{i}" for i, (t, _) in enumerate(INVALID_PAYLOADS)])
def test_bad_payload_is_invalid_message_with_related_id(mtype, payload):
    with pytest.raises(errors.ProtoError) as info:
        parse(raw(mtype, payload, id="bad-1"))
    assert info.value.code == "INVALID_MESSAGE"
    assert info.value.related_id == "bad-1"
    assert info.value.detail  # the validation errors are reported


def test_payload_detail_names_the_failing_field():
    with pytest.raises(errors.InvalidMessage) as info:
        parse(raw("TOOL_CALL", {"call_id": "c1", "tool": "echo"}))
    assert "params" in info.value.detail


# -- run_id -> MISSING_RUN_ID -------------------------------------------------------------------


@pytest.mark.parametrize("mtype", ["RUN_FINISHED", "RUN_CANCEL"])
def test_run_without_run_id_is_missing_run_id(mtype):
    with pytest.raises(errors.ProtoError) as info:
        parse(raw(mtype, {}, channel="USER", id="r-msg"))
    assert info.value.code == "MISSING_RUN_ID"
    assert info.value.related_id == "r-msg"
    assert info.value.to_payload()["code"] == "MISSING_RUN_ID"


def test_run_finished_without_run_id_but_with_summary_is_missing_run_id():
    with pytest.raises(errors.ProtoError) as info:
        parse(raw("RUN_FINISHED", {"summary": {"x": 1}}))
    assert info.value.code == "MISSING_RUN_ID"


def test_run_started_without_run_id_is_fine():
    assert parse(raw("RUN_STARTED", {"thread_id": "t"})).payload["thread_id"] == "t"


# -- seq numbers in payloads: strings or ints (docs/PROTOCOL.md §2) --------------------------


@pytest.mark.parametrize("value,expected", [("0", 0), (0, 0), ("12", 12), (12, 12),
                                            ("9007199254740991", 2 ** 53 - 1),
                                            (2 ** 53 - 1, 2 ** 53 - 1)])
def test_ack_seq_accepts_decimal_strings_and_ints(value, expected):
    assert parse(raw("ACK", {"seq": value})).payload["seq"] == expected


@pytest.mark.parametrize("field,value", [
    ("seq", "9007199254740992"), ("seq", 2 ** 53), ("seq", "1" * 64), ("seq", 10 ** 64)])
def test_payload_seqs_stop_at_2_pow_53_minus_1(field, value):
    """Every layer stores a seq as an int64 or a JS number: 2^53-1 is the most."""
    for mtype, payload in (("ACK", {"seq": value}), ("REPLAY_REQUEST", {"from_seq": value}),
                           ("REPLAY_REQUEST", {"from_seq": 1, "to_seq": value})):
        with pytest.raises(InvalidMessage) as info:
            parse(raw(mtype, payload))
        assert "9007199254740991" in orjson.dumps(info.value.detail).decode()


def test_envelope_seq_stops_at_2_pow_53_minus_1():
    ok = {"id": "a", "session": "", "seq": "9007199254740991", "ts": "1", "type": "PING",
          "channel": "SYSTEM", "payload": {"nonce": "n"}}
    assert parse(orjson.dumps(ok)).seq == 2 ** 53 - 1
    for seq in ("9007199254740992", "9" * 17, "1" * 64):
        with pytest.raises(InvalidMessage):
            parse(orjson.dumps({**ok, "seq": seq}))


@pytest.mark.parametrize("from_seq,to_seq", [("3", "10"), (3, 10), ("3", 10), (3, "10")])
def test_replay_request_seqs_accept_strings_and_ints(from_seq, to_seq):
    p = parse(raw("REPLAY_REQUEST", {"from_seq": from_seq, "to_seq": to_seq})).payload
    assert (p["from_seq"], p["to_seq"]) == (3, 10)
    assert isinstance(p["from_seq"], int) and isinstance(p["to_seq"], int)


# -- the envelope itself ------------------------------------------------------------------------


def test_envelope_seq_and_ts_become_ints_and_go_back_out_as_strings():
    msg = parse(raw("PING", {"nonce": "n"}, seq="17", ts="1700000000999"))
    assert (msg.seq, msg.ts) == (17, 1700000000999)
    wire = msg.to_wire()
    assert (wire["seq"], wire["ts"]) == ("17", "1700000000999")
    assert json.loads(encode(wire)) == wire


@pytest.mark.parametrize("field,value", [
    ("seq", 1), ("seq", 1.0), ("seq", None), ("seq", ""), ("seq", "0"), ("seq", "-3"),
    ("seq", "1.5"), ("seq", "abc"), ("seq", " 1"), ("seq", "1\n"),
    ("ts", 1700000000000), ("ts", None), ("ts", ""), ("ts", "-1"), ("ts", "1.5"),
    ("ts", "soon"),
])
def test_envelope_seq_and_ts_must_be_decimal_strings(field, value):
    env = envelope("PING", {"nonce": "n"}, id="e-1")
    env[field] = value
    with pytest.raises(errors.ProtoError) as info:
        parse(json.dumps(env))
    assert info.value.code == "INVALID_MESSAGE"
    assert info.value.related_id == "e-1"
    assert field in info.value.detail


@pytest.mark.parametrize("field", ["id", "session", "seq", "ts", "type", "channel", "payload"])
def test_every_envelope_field_is_required(field):
    env = envelope("PING", {"nonce": "n"})
    del env[field]
    with pytest.raises(errors.ProtoError) as info:
        parse(json.dumps(env))
    assert info.value.code == "INVALID_MESSAGE"
    assert field in info.value.detail


@pytest.mark.parametrize("field,value", [
    ("id", 5), ("id", ""), ("session", 5), ("type", 5), ("channel", 5),
    ("payload", []), ("payload", "x"), ("payload", None),
])
def test_mistyped_envelope_fields_are_invalid_message(field, value):
    env = envelope("PING", {"nonce": "n"})
    env[field] = value
    with pytest.raises(errors.ProtoError) as info:
        parse(json.dumps(env))
    assert info.value.code == "INVALID_MESSAGE"


@pytest.mark.parametrize("channel", ["", "user", "BOGUS", "SYSTEM "])
def test_unknown_channel_is_invalid_message(channel):
    with pytest.raises(errors.ProtoError) as info:
        parse(raw("PING", {"nonce": "n"}, channel=channel, id="ch-1"))
    assert info.value.code == "INVALID_MESSAGE"
    assert info.value.related_id == "ch-1"


@pytest.mark.parametrize("channel", ["SYSTEM", "USER", "AGENT", "AUDIO_IN", "AUDIO_OUT"])
def test_every_contract_channel_is_accepted(channel):
    assert parse(raw("PING", {"nonce": "n"}, channel=channel)).channel == channel


@pytest.mark.parametrize("mtype", ["BOGUS", "", "ping", "TOOL_DONE", "TOOL_UPDATE", "ERROR"])
def test_unknown_type_is_unsupported_type(mtype):
    with pytest.raises(errors.ProtoError) as info:
        parse(raw(mtype, {}, channel="USER", id="t-1"))
    assert info.value.code == "UNSUPPORTED_TYPE"
    assert info.value.related_id == "t-1"


def test_unknown_type_is_only_detected_by_validate_payload():
    msg = parse_envelope(raw("BOGUS", {"x": 1}, channel="USER"))
    assert msg.type == "BOGUS" and msg.payload == {"x": 1}
    with pytest.raises(errors.UnsupportedType):
        validate_payload(msg)


def test_parse_envelope_leaves_the_payload_unvalidated():
    msg = parse_envelope(raw("PING", {}))
    assert msg.payload == {}
    with pytest.raises(errors.InvalidMessage):
        validate_payload(msg)


@pytest.mark.parametrize("text", [
    b"", b"not json", b"{", b'{"id": "x",}', b"\xff\xfe", "{'id': 'x'}",
])
def test_non_json_is_invalid_message_without_related_id(text):
    with pytest.raises(errors.ProtoError) as info:
        parse(text)
    assert info.value.code == "INVALID_MESSAGE"
    assert info.value.related_id is None


@pytest.mark.parametrize("text", ["[]", "[{}]", '"PING"', "42", "null", "true"])
def test_non_object_json_is_invalid_message(text):
    with pytest.raises(errors.ProtoError) as info:
        parse(text)
    assert info.value.code == "INVALID_MESSAGE"


def test_validate_envelope_refuses_non_dicts():
    with pytest.raises(errors.InvalidMessage):
        validate_envelope([envelope("PING", {"nonce": "n"})])


@pytest.mark.parametrize("bad_id,expected", [("good-id", "good-id"), ("", None), (17, None),
                                             (None, None), (["x"], None)])
def test_related_id_is_set_only_when_the_id_is_usable(bad_id, expected):
    env = envelope("PING", {"nonce": "n"}, id=bad_id, seq=3)  # seq must be a string
    with pytest.raises(errors.ProtoError) as info:
        parse(json.dumps(env))
    assert info.value.code == "INVALID_MESSAGE"
    assert info.value.related_id == expected
    assert ("related_id" in info.value.to_payload()) == (expected is not None)


def test_accepts_bytes_bytearray_memoryview_and_str():
    data = raw("PING", {"nonce": "n"})
    for form in (data, bytearray(data), memoryview(data), data.decode()):
        assert parse(form).payload == {"nonce": "n"}


# -- size limit ------------------------------------------------------------------------------


def test_message_at_the_limit_passes_and_one_byte_more_is_too_large():
    data = raw("PING", {"nonce": "x" * 100})
    assert parse(data, max_size=len(data)).type == "PING"
    with pytest.raises(errors.ProtoError) as info:
        parse(data, max_size=len(data) - 1)
    assert info.value.code == "MESSAGE_TOO_LARGE"
    assert info.value.http_status == 413


def test_oversize_is_reported_before_json_is_parsed():
    with pytest.raises(errors.MessageTooLarge):
        parse_envelope(b"x" * 101, max_size=100)


def test_size_limit_counts_utf8_bytes_of_text_frames():
    # docs/PROTOCOL.md §2: maxMessageSize is in bytes; a text frame is measured by its encoding.
    text = raw("PING", {"nonce": "é" * 50}, ).decode()
    nbytes = len(text.encode("utf-8"))
    assert nbytes == len(text) + 50
    assert parse(text, max_size=nbytes).type == "PING"
    with pytest.raises(errors.MessageTooLarge):
        parse(text, max_size=len(text))


def test_no_size_limit_when_max_size_is_none():
    # (the nonce itself is capped at MAX_NONCE_LENGTH: the size rides on an extra field)
    big = parse(raw("PING", {"nonce": "n", "pad": "y" * 100_000}))
    assert big.payload["pad"] == "y" * 100_000


# -- helpers ------------------------------------------------------------------------------------


def test_decode_json_round_trips_encode():
    wire = envelope("PING", {"nonce": "é"})
    assert decode_json(encode(wire)) == wire
    with pytest.raises(errors.InvalidMessage):
        decode_json(b"{nope")


def _nest(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("wide", [0, 300_000])
def test_the_depth_limit_holds_for_small_and_very_wide_payloads(wide: int) -> None:
    """A payload of many containers is checked a level at a time (issue 24: 300,000
    ``{}`` took over a second one by one); the limit is the same either way: the
    payload is level 2, params 3, the list 4, the nest's root 5, so 59 more levels reach
    64 and 60 pass it."""
    for levels, refused in ((59, False), (60, True)):
        params = {"pad": [{}] * wide + [_nest(levels)], "other": [[[]]] * 100}
        data = raw("TOOL_CALL", {"call_id": "c", "tool": "t", "params": params})
        if refused:
            with pytest.raises(InvalidMessage, match="nested deeper than 64"):
                parse_envelope(data)
        else:
            assert parse_envelope(data).payload["params"]["pad"][-1] == _nest(levels)
