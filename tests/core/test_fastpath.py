"""The fast path accepts exactly what the marshmallow schemas accept, with the same result.

Inputs are drawn near the boundary: each field either valid or any JSON value, fields
dropped or added, so both sides disagree if either is wrong somewhere.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from protoflask.core import envelope
from protoflask.core.envelope import Message

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=6)


def either(valid):
    return st.one_of(valid, json_values)


ids = st.text(min_size=1, max_size=6)
seq_strings = st.from_regex(r"[1-9][0-9]{0,5}", fullmatch=True) | st.sampled_from(
    ["0", "01", "1.5", "-1", " 1", "1\n", "١", "²", "1²", "9007199254740991",
     "9007199254740992", "10000000000000000", "12345678901234567"])
ts_strings = st.from_regex(r"[0-9]{1,5}", fullmatch=True) | st.sampled_from(
    ["", "x", "1e3", "²", "1" * 64, "1" * 65, "0" * 64])
channels = st.sampled_from(list(envelope.CHANNELS) + ["user", "OTHER"])


@st.composite
def objects(draw, fields):
    out = {}
    for name, strategy in fields.items():
        if draw(st.integers(0, 9)) > 0:
            out[name] = draw(either(strategy))
    if draw(st.booleans()):
        out[draw(st.text(max_size=4))] = draw(json_values)
    return out


envelopes = objects({"id": ids, "session": st.text(max_size=4), "seq": seq_strings,
                     "ts": ts_strings, "type": st.sampled_from(["PING", "X"]),
                     "channel": channels, "payload": st.dictionaries(st.text(max_size=3),
                                                                     json_values, max_size=2)})

PAYLOADS = {
    "PING": {"nonce": st.text(max_size=4)},
    "PONG": {"nonce": st.text(max_size=4)},
    "MESSAGE_START": {"message_id": st.text(max_size=4), "content_type": st.text(max_size=4)},
    "MESSAGE_PART": {"message_id": st.text(max_size=4), "content": st.text(max_size=4)},
    "MESSAGE_END": {"message_id": st.text(max_size=4)},
    "TOOL_CALL": {"call_id": st.text(max_size=4), "tool": st.text(max_size=4),
                  "params": st.dictionaries(st.text(max_size=3), json_values, max_size=2),
                  "run_id": st.none() | st.text(max_size=4)},
    "HELLO": {"proto_version": st.sampled_from(["1.1.2", "1.1", "١.1.2", "10.0.0"]),
              "accept_major": st.lists(st.integers() | st.booleans(), max_size=3),
              "accept_events": st.lists(st.text(max_size=4), max_size=3),
              "capabilities": st.dictionaries(st.text(max_size=3), json_values, max_size=2)},
}
assert set(PAYLOADS) == set(envelope.PAYLOAD_CHECKS)


def slow_envelope(obj):
    try:
        return envelope._load_envelope(obj)
    except Exception as exc:  # noqa: BLE001 - compared by type below
        return exc


@settings(max_examples=400, deadline=None)
@given(envelopes)
def test_envelope_fast_path_agrees_with_schema(obj):
    fast = envelope._accept_envelope(obj)
    slow = slow_envelope(obj)
    if fast is not None or isinstance(slow, Message):
        assert fast == slow  # same acceptance, same Message


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PAYLOADS)).flatmap(
    lambda t: st.tuples(st.just(t), objects(PAYLOADS[t]))))
def test_payload_fast_path_agrees_with_schema(case):
    mtype, payload = case
    msg = Message("i", "", 1, 1, mtype, "USER", payload)
    # its own copy: the fast path may complete the decoded dict in place (TOOL_CALL's
    # run_id), and the schema must see what the client sent
    fast = envelope.PAYLOAD_CHECKS[mtype](copy.deepcopy(payload))
    try:
        slow = envelope._load_payload(msg).payload
    except Exception as exc:  # noqa: BLE001
        slow = exc
    if fast is not None:
        assert fast == slow
    if isinstance(slow, dict):
        assert fast == slow, "the fast path should accept every valid hot payload"


def test_valid_envelopes_take_the_fast_path():
    obj = {"id": "a", "session": "", "seq": "12", "ts": "0", "type": "PING",
           "channel": "SYSTEM", "payload": {"nonce": "n"}}
    assert envelope._accept_envelope(obj) == envelope._load_envelope(obj)


def test_tool_call_run_id_default_is_written_in_place():
    """A valid TOOL_CALL payload without run_id gets the schema's None in the decoded
    dict itself, so the message is kept as it is (no copy)."""
    payload = {"call_id": "c", "tool": "echo", "params": {"message": "m"}}
    msg = Message("i", "", 1, 1, "TOOL_CALL", "USER", payload)
    assert envelope.validate_payload(msg) is msg
    assert payload == envelope._load_payload(
        Message("i", "", 1, 1, "TOOL_CALL", "USER",
                {"call_id": "c", "tool": "echo", "params": {"message": "m"}})).payload
    refused = {"call_id": "c", "tool": "echo", "params": []}
    assert envelope._accept_tool_call(refused) is None and "run_id" not in refused


@pytest.mark.parametrize("payload", [
    {"proto_version": "1.1.2", "accept_major": [1]},
    {"proto_version": "1.1.2", "accept_major": [1], "accept_events": ["PONG"],
     "capabilities": {"flow_control": {"downstream": True}}, "x": 1}])
def test_a_hello_is_kept_as_it_is(payload):
    """A valid HELLO payload is the decoded dict itself, the schema's defaults written into
    it (as TOOL_CALL's run_id): no copy, no second Message; equal to the schema's."""
    msg = Message("i", "", 1, 1, "HELLO", "SYSTEM", payload)
    slow = envelope._load_payload(Message("i", "", 1, 1, "HELLO", "SYSTEM",
                                          copy.deepcopy(payload))).payload
    assert envelope.validate_payload(msg) is msg
    assert payload == slow
    refused = {"proto_version": "1.1.2", "accept_major": ["1"]}
    assert envelope._accept_hello(refused) is None and set(refused) == {"proto_version",
                                                                         "accept_major"}


# -- parse_envelope: the swap point and its two implementations ---------------------------


def outcome(parse, raw, **kwargs):
    """What parsing ``raw`` gives: the Message, or the error's type, code, text, detail and
    related id (what reaches the client)."""
    try:
        return parse(raw, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared field by field
        return (type(exc), getattr(exc, "code", None), str(exc), getattr(exc, "detail", None),
                getattr(exc, "related_id", None))


def wire(obj) -> bytes:
    return json.dumps(obj).encode()


class TestParseEnvelope:
    """The same cases over parse_envelope_plain (the definition) and parse_envelope_fast
    (decode_json and validate_envelope's common case inline), as websockets' frame tests
    run over its C and Python implementations."""

    @pytest.fixture(params=[envelope.parse_envelope_plain, envelope.parse_envelope_fast],
                    ids=["plain", "fast"])
    def parse(self, request):
        return request.param

    def ping(self, **fields):
        return {"id": "a", "session": "", "seq": "12", "ts": "5", "type": "PING",
                "channel": "SYSTEM", "payload": {"nonce": "n"}, **fields}

    def test_the_swap_point_serves_the_fast_one(self):
        assert envelope.parse_envelope is envelope.parse_envelope_fast

    @pytest.mark.parametrize("raw", [wire({"id": "a", "session": "", "seq": "12", "ts": "5",
                                           "type": "PING", "channel": "SYSTEM",
                                           "payload": {"nonce": "n"}}),
                                     bytearray(b'{"id":"a","session":"","seq":"1","ts":"0",'
                                               b'"type":"X","channel":"USER","payload":{}}'),
                                     '{"id":"é","session":"s","seq":"3","ts":"0",'
                                     '"type":"PONG","channel":"SYSTEM","payload":{"a":[1]}}'])
    def test_a_valid_envelope_is_its_message(self, parse, raw):
        msg = parse(raw)
        assert isinstance(msg, Message)
        assert msg == envelope.validate_envelope(json.loads(bytes(raw) if not isinstance(
            raw, str) else raw))

    @pytest.mark.parametrize("raw,code,text", [
        (b"not json", "INVALID_MESSAGE", "not valid JSON"),
        (b"\xff\xfe", "INVALID_MESSAGE", "not valid JSON"),
        (b"[1, 2]", "INVALID_MESSAGE", "must be a JSON object"),
        (b'"text"', "INVALID_MESSAGE", "must be a JSON object"),
    ])
    def test_what_is_not_an_envelope_is_refused(self, parse, raw, code, text):
        kind, got_code, got_text, _, _ = outcome(parse, raw)
        assert got_code == code and text in got_text

    @pytest.mark.parametrize("field,value", [("seq", "0"), ("seq", "01"), ("seq", 7),
                                             ("channel", "NOPE"), ("payload", []),
                                             ("ts", "x"), ("id", "")])
    def test_a_bad_field_is_refused_with_the_schemas_words(self, parse, field, value):
        got = outcome(parse, wire(self.ping(**{field: value})))
        assert got[1] == "INVALID_MESSAGE" and got[3]  # marshmallow's detail
        assert got == outcome(envelope.parse_envelope_plain,
                              wire(self.ping(**{field: value})))

    @pytest.mark.parametrize("raw", [b"x" * 101, "é" * 51])  # 101 bytes, 102 in UTF-8
    def test_too_large_is_counted_in_bytes(self, parse, raw):
        got = outcome(parse, raw, max_size=100)
        assert got[1] == "MESSAGE_TOO_LARGE" and "exceeds 100" in got[2]

    def test_the_callers_size_is_believed(self, parse):
        raw = wire(self.ping())
        assert isinstance(parse(raw, max_size=len(raw)), Message)
        assert outcome(parse, raw, max_size=len(raw), size=len(raw) + 1)[1] == \
            "MESSAGE_TOO_LARGE"

    def test_nesting_past_max_depth_is_refused(self, parse):
        deep = self.ping(payload={"a": {"b": {"c": {}}}})
        assert isinstance(parse(wire(deep), max_depth=5), Message)
        got = outcome(parse, wire(deep), max_depth=3)
        assert not isinstance(got, Message), "nesting past max_depth was accepted"
        assert got[1] == "INVALID_MESSAGE"

    @pytest.mark.parametrize("max_depth", range(2, 8))
    @pytest.mark.parametrize("payload", [
        {"a": {"b": {"c": {}}}}, {"a": [[1], {"b": []}]}, {"a": "{[{[", "b": {"c": []}},
        # one level of containers holding none (a TOOL_CALL's params: not counted), and
        # one that holds one, or too many items to be looked into
        {"call_id": "c", "params": {"m": "x", "n": 1}}, {"a": [1, "b"], "c": {}},
        {"params": {"m": "x", "n": [1]}}, {"a": [1, {}]}, {"a": {str(i): i for i in range(40)}},
        {"a": list(range(40)) + [[]]}])
    def test_at_the_edge_of_max_depth_both_answer_alike(self, max_depth, payload):
        """Around the containers' count (the fast one skips the walk at or below it):
        strings with braces in them count, and only make it walk; a payload's containers
        of scalars are looked into, not counted."""
        raw = wire(self.ping(payload=payload))
        assert outcome(envelope.parse_envelope_fast, raw, max_depth=max_depth) == \
            outcome(envelope.parse_envelope_plain, raw, max_depth=max_depth)

    @settings(max_examples=300, deadline=None)
    @given(envelopes | json_values, st.sampled_from([2, 3, 32]),
           st.none() | st.integers(0, 200))
    def test_any_input_gets_the_same_answer_from_both(self, obj, depth, max_size):
        raw = wire(obj)
        assert outcome(envelope.parse_envelope_fast, raw, max_depth=depth,
                       max_size=max_size) == \
            outcome(envelope.parse_envelope_plain, raw, max_depth=depth, max_size=max_size)
