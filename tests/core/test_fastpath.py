"""The fast path accepts exactly what the marshmallow schemas accept, with the same result.

Inputs are drawn near the boundary: each field either valid or any JSON value, fields
dropped or added, so both sides disagree if either is wrong somewhere.
"""

from __future__ import annotations

import copy

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
