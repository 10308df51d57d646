"""Property tests of everything that reads client input in the core: any bytes, any JSON,
any payload for every type become a valid message or a contract ProtoError, and a
session fed anything answers with events and ERROR messages, never an exception.

PROTOFLASK_FUZZ_EXAMPLES raises the example count per test (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from protoflask.core.handoff import snapshot
from protoflask.core import envelope
from protoflask.core.envelope import CLIENT_TYPES, PAYLOAD_SCHEMAS, Message
from protoflask.core.errors import ERRORS_BY_CODE, InvalidMessage, ProtoError
from protoflask.core.session import Event, ProtocolSession

from ._support import receive_decoded_events, receive_events, session_settings, tick_events

EXAMPLES = int(os.environ.get("PROTOFLASK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=4),
                           max_leaves=12)

#: Values each payload field should hold, drawn next to arbitrary JSON.
FIELD_VALUES = {
    "proto_version": st.sampled_from(["1.1.2", "2.0.0", "1.1", "x"]),
    "accept_major": st.lists(st.integers(0, 3), max_size=3),
    "accept_events": st.lists(st.sampled_from(sorted(CLIENT_TYPES) + ["NOPE"]), max_size=4),
    "capabilities": st.fixed_dictionaries({"flow_control": st.fixed_dictionaries({
        "initial_credit_messages": json_scalars, "initial_credit_bytes": json_scalars})}),
    "seq": st.integers(0, 2**64) | st.from_regex(r"[0-9]{1,70}", fullmatch=True),
    "from_seq": st.integers(0, 2**64) | st.from_regex(r"[0-9]{1,70}", fullmatch=True),
    "to_seq": st.none() | st.integers(0, 2**64) | st.from_regex(r"[0-9]{1,70}", fullmatch=True),
    "channel": st.sampled_from(list(envelope.CHANNELS) + ["user", ""]),
    "add_messages": st.integers(-5, 2**40), "add_bytes": st.integers(-5, 2**40),
    "params": st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    "data": st.sampled_from(["", "AAAA", "not base64!", "QUJD"]),
    "final": st.booleans(),
}


def field_value(name: str) -> st.SearchStrategy:
    return st.one_of(FIELD_VALUES.get(name, st.text(max_size=8)), json_values)


@st.composite
def payload_for(draw, mtype: str) -> dict:
    names = list(PAYLOAD_SCHEMAS[mtype].fields)
    out = {name: draw(field_value(name)) for name in names if draw(st.integers(0, 7)) > 0}
    if draw(st.booleans()):
        out[draw(st.text(max_size=5))] = draw(json_values)
    return out


@st.composite
def envelopes(draw) -> dict:
    mtype = draw(st.sampled_from(sorted(CLIENT_TYPES) + ["ERROR", "NOPE", ""]))
    env = {"id": draw(st.text(max_size=6) | json_values), "session": draw(st.text(max_size=4)),
           "seq": draw(st.from_regex(r"[1-9][0-9]{0,6}", fullmatch=True) | json_values),
           "ts": draw(st.from_regex(r"[0-9]{1,13}", fullmatch=True) | json_values),
           "type": mtype,
           "channel": draw(st.sampled_from(list(envelope.CHANNELS) + ["OTHER"])),
           "payload": draw(payload_for(mtype) if mtype in PAYLOAD_SCHEMAS else json_values)}
    for name in list(env):
        if draw(st.integers(0, 15)) == 0:
            del env[name]
    return env


def nested(depth: int) -> bytes:
    """JSON text of ``depth`` nested containers (orjson cannot encode past 254)."""
    opening = b"".join(b"[" if i % 2 else b'{"k":' for i in range(depth))
    closing = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opening + b"1" + closing


def wire(payload: object, seq: str = "1", ts: str = "1", mtype: str = "PING",
         deep: int = 0) -> bytes:
    """An envelope; ``deep`` adds a field nested that many levels to the payload."""
    raw = orjson.dumps({"id": "x", "session": "", "seq": seq, "ts": ts, "type": mtype,
                        "channel": "SYSTEM", "payload": payload})
    if deep:
        raw = raw[:-2] + b',"deep":' + nested(deep) + b"}}"
    return raw


HOSTILE_BYTES = [
    b"", b"\x00", b"\xff\xfe\xfd", b"\xef\xbb\xbf{}", b"{" * 2000, b"[" * 1100 + b"]" * 1100,
    b'{"id": "\xc3\x28"}', b'"\\ud800"', b"NaN", b"Infinity", b"-Infinity", b"1e999",
    b"9" * 5000, b'{"a":' * 300 + b"1" + b"}" * 300,
    wire({"nonce": "n"}, seq="9" * 5000), wire({"nonce": "n"}, ts="9" * 5000),
    wire({"nonce": "n"}, seq="\u0661"), wire({"nonce": "n"}, seq="1" * 65),
    wire({"seq": "9" * 5000}, mtype="ACK"), wire({"from_seq": "7" * 5000}, mtype="REPLAY_REQUEST"),
    wire({"nonce": "n"}, deep=70), wire({"nonce": "n"}, deep=300),
    wire({"nonce": "n"}, deep=1000), wire({"call_id": "c", "tool": "t", "params": {}},
                                          mtype="TOOL_CALL", deep=250),
]


def dumps(value: object) -> bytes:
    """Test input as JSON text (the standard library writes integers of any size)."""
    return json.dumps(value).encode()


def assert_contract_error(exc: BaseException) -> None:
    assert isinstance(exc, ProtoError), f"{type(exc).__name__} escaped: {exc!r}"
    assert ERRORS_BY_CODE.get(exc.code) is type(exc)
    orjson.dumps(exc.to_payload(), option=orjson.OPT_NON_STR_KEYS)  # it can be sent


def parse_outcome(raw: bytes | str) -> Message | ProtoError:
    try:
        return envelope.parse(raw, max_size=1048576)
    except ProtoError as exc:
        assert_contract_error(exc)
        return exc


@FUZZ
@given(st.binary(max_size=300))
@example(b'{"id":"a","session":"","seq":"1","ts":"1","type":"PING","channel":"SYSTEM",'
         b'"payload":{"nonce":"n"}}')
def test_any_bytes_parse_to_a_message_or_a_contract_error(raw):
    parse_outcome(raw)


@pytest.mark.parametrize("raw", HOSTILE_BYTES, ids=range(len(HOSTILE_BYTES)))
def test_hostile_bytes_are_contract_errors(raw):
    outcome = parse_outcome(raw)
    assert isinstance(outcome, ProtoError), outcome


@FUZZ
@given(st.text(max_size=200))
def test_any_text_parses_to_a_message_or_a_contract_error(text):
    parse_outcome(text)


@FUZZ
@given(json_values)
def test_any_json_value_is_a_message_or_a_contract_error(value):
    parse_outcome(dumps(value))


@FUZZ
@given(envelopes())
def test_near_valid_envelopes_are_messages_or_contract_errors(env):
    outcome = parse_outcome(dumps(env))
    if isinstance(outcome, Message):
        assert outcome.type in CLIENT_TYPES and outcome.channel in envelope.CHANNELS
        assert outcome.seq >= 1 and isinstance(outcome.payload, dict)


@pytest.mark.parametrize("mtype", sorted(PAYLOAD_SCHEMAS))
def test_every_payload_schema_takes_anything(mtype):
    @FUZZ
    @given(payload_for(mtype))
    def check(payload):
        msg = Message("i", "", 1, 1, mtype, "USER", payload)
        try:
            valid = envelope.validate_payload(msg)
        except ProtoError as exc:
            assert_contract_error(exc)
            return
        assert set(PAYLOAD_SCHEMAS[mtype].load(payload)) <= set(valid.payload)
    check()


@pytest.mark.parametrize("depth,ok", [(63, True), (64, True), (65, False), (2000, False)])
def test_nesting_is_cut_at_max_json_depth(depth, ok):
    # the envelope is level 1, the payload level 2, so the payload holds depth - 2 more
    outcome = parse_outcome(wire({"nonce": "n"}, deep=depth - 2))
    assert isinstance(outcome, Message) is ok, outcome
    if not ok:
        assert outcome.code == "INVALID_MESSAGE"


def test_depth_limit_is_a_setting():
    raw = wire({"nonce": "n"}, deep=10)
    assert isinstance(envelope.parse(raw), Message)
    with pytest.raises(InvalidMessage, match="deeper than 8"):
        envelope.parse(raw, max_depth=8)


# -- a whole session fed anything ---------------------------------------------------------

HELLO = wire({"proto_version": "1.1.2", "accept_major": [1], "accept_events": []},
             mtype="HELLO")

frames = st.one_of(
    st.binary(max_size=120),
    envelopes().map(dumps),
    json_values.map(dumps),
    st.sampled_from(HOSTILE_BYTES),
    st.lists(envelopes(), max_size=3).map(dumps),
)


@FUZZ
@given(st.lists(frames, max_size=25), st.booleans(), st.integers(0, 3))
def test_a_session_answers_anything_with_events_and_errors(inputs, hello_first, rate):
    settings_ = session_settings(rate_limit=rate * 5, rate_limit_burst=4,
                                max_message_size=4096)
    session = ProtocolSession("s", "u", settings_, 0)
    session.attach(0)
    now = 1
    for raw in ([HELLO] if hello_first else []) + inputs:
        now += 7
        events = receive_events(session, raw, now)
        assert all(isinstance(e, Event.__args__) for e in events)  # type: ignore[attr-defined]
        tick_events(session, now)
        for _, data in session.take_writable(now):
            sent = orjson.loads(data)
            if sent["type"] == "ERROR":
                assert sent["payload"]["code"] in ERRORS_BY_CODE
    # decoded elements (a JSON array body) take the same road
    for raw in inputs[:5]:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        now += 7
        receive_decoded_events(session, obj, len(raw), now)
        session.take_writable(now)
    snapshot(session)
