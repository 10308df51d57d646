"""How a POST body splits into messages and how seqs written as text are read
(core/bodies.py): one envelope goes to the session's own parser whole, an array's
elements are decoded here and sized by their encoding, NDJSON lines keep their bytes."""

from __future__ import annotations

import orjson
import pytest

from protoflask.core.bodies import is_raw, is_seq, parse_seq_arg, split_body
from protoflask.core.envelope import MAX_SEQ
from protoflask.core.errors import InvalidMessage

ENV = {"id": "m1", "session": "s", "seq": "1", "ts": "0", "type": "PING", "channel": "CONTROL",
       "payload": {}}


def test_one_envelope_is_left_whole_for_the_session_to_parse():
    body = orjson.dumps(ENV)
    assert split_body(body) == [(body, len(body))]
    assert is_raw(split_body(body)[0])


def test_any_single_json_value_is_left_whole_too():
    # not an envelope: the session's parser reports it, as for a WebSocket frame
    assert split_body(b'"text"') == [(b'"text"', 6)]


def test_array_elements_are_decoded_and_sized_by_their_own_encoding():
    second = dict(ENV, id="m2", seq="2")
    body = b"[ " + orjson.dumps(ENV) + b" ,\n " + orjson.dumps(second) + b" ]"
    parts = split_body(body)
    assert parts == [(ENV, len(orjson.dumps(ENV))), (second, len(orjson.dumps(second)))]
    assert not any(is_raw(p) for p in parts)


def test_an_empty_array_has_no_messages():
    assert split_body(b"[]") == []


def test_array_element_that_cannot_be_encoded_again_costs_the_whole_body():
    # orjson decodes up to 1024 levels of nesting but encodes at most 254
    body = b"[" + b"[" * 300 + b"]" * 300 + b"]"
    parts = split_body(body)
    assert len(parts) == 1 and parts[0][1] == len(body)


def test_ndjson_lines_are_decoded_one_by_one_with_their_byte_sizes():
    a, b = orjson.dumps(ENV), orjson.dumps(dict(ENV, id="m2", seq="2"))
    body = a + b"\r\n\n  " + b + b"\n"
    assert split_body(body) == [(ENV, len(a)), (orjson.loads(b), len(b))]


def test_ndjson_line_that_is_not_json_is_left_raw_for_the_session_to_refuse():
    a = orjson.dumps(ENV)
    body = a + b"\nnot json\n"
    parts = split_body(body)
    assert parts == [(ENV, len(a)), (b"not json", 8)]
    assert [is_raw(p) for p in parts] == [False, True]


@pytest.mark.parametrize("body", [b"not json", b"", b"\n\n", b"{\n}x"])
def test_a_body_with_no_json_line_is_invalid(body):
    with pytest.raises(InvalidMessage):
        split_body(body)


@pytest.mark.parametrize("text", ["0", "1", "007", str(MAX_SEQ)])
def test_seqs_as_text(text):
    assert is_seq(text)
    assert parse_seq_arg(text, "last_seq") == int(text)


@pytest.mark.parametrize("text", ["-1", "1.0", "²", "١", " 1", str(MAX_SEQ + 1),
                                  "1" * 17, "0x1"])
def test_not_seqs(text):
    assert not is_seq(text)
    with pytest.raises(InvalidMessage, match="last_seq must be a decimal number"):
        parse_seq_arg(text, "last_seq")


@pytest.mark.parametrize("value", [None, ""])
def test_an_absent_seq_argument_is_none(value):
    assert parse_seq_arg(value, "last_seq") is None
