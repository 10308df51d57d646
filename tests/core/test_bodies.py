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


# -- the NDJSON fast path gives what trying the whole body first gives --------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from protoflask.core.bodies import _line_parts, _ndjson_lines  # noqa: E402  (the fast path)

_NOT = object()


def _reference_split(body: bytes) -> list:
    """split_body as it was before the fast path: the whole body first, then lines."""
    def loads(data: bytes):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return _NOT

    whole = loads(body)
    if isinstance(whole, list):
        out = []
        for item in whole:
            try:
                out.append((item, len(orjson.dumps(item))))
            except orjson.JSONEncodeError:
                out.append((item, len(body)))
        return out
    if whole is not _NOT:
        return [(body, len(body))]
    lines = [line.strip() for line in body.split(b"\n")]
    lines = [line for line in lines if line]
    decoded = [loads(line) for line in lines]
    if all(obj is _NOT for obj in decoded):
        raise InvalidMessage("not JSON")
    return [(line, len(line)) if obj is _NOT else (obj, len(line))
            for line, obj in zip(lines, decoded, strict=True)]


def _answer(fn, body: bytes):
    try:
        return fn(body)
    except InvalidMessage:
        return "invalid"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                               max_size=3),
    max_leaves=6)
# pieces a body is made of: compact JSON, pretty-printed JSON (a value over several
# lines), a JSON value's fragments, junk, and every kind of blank
_piece = st.one_of(
    _json.map(orjson.dumps),
    _json.map(lambda v: orjson.dumps(v, option=orjson.OPT_INDENT_2)),
    st.sampled_from([b"[", b"]", b"{", b"}", b",", b'"a"', b"1", b"-", b"tru", b"not json",
                     b"\xff", b" ", b"\t", b"\r", b"\x0b", b"\x0c", b"", b"\xef\xbb\xbf"]),
)
_sep = st.sampled_from([b"\n", b"\r\n", b"\n\n", b" \n ", b"\n\x0c", b"", b" "])


@st.composite
def _bodies(draw) -> bytes:
    pieces = draw(st.lists(_piece, max_size=6))
    out = b""
    for piece in pieces:
        out += piece + draw(_sep)
    return out


# 300 examples (about 5 s) draw every piece and separator kind many times over; 2,000
# cost the suite half a minute.
@settings(max_examples=300, deadline=None)
@given(_bodies())
def test_split_body_answers_as_the_whole_body_first_did(body):
    assert _answer(split_body, body) == _answer(_reference_split, body)


@pytest.mark.parametrize("body", [
    b'{"a":1}\n{"b":2}\n',                 # the common NDJSON body
    b'1\n2', b'"x"\r\n  \nnot json\n',      # literals; a junk line after a JSON one
    b'[1,\n2]', b'{\n"a": 1\n}\n',          # one value over several lines: not this path
    b'{"a":1}\n', b'\n\n{"a":1}\n\n',       # one line: not this path either
])
def test_the_fast_path_takes_only_what_it_can_answer(body):
    fast = _ndjson_lines(body)
    if fast is not None:
        assert list(_line_parts(fast)) == _reference_split(body)
    lines = [x for x in body.split(b"\n") if x.strip()]
    try:
        first_is_json = bool(lines) and orjson.loads(lines[0]) is not _NOT
    except orjson.JSONDecodeError:
        first_is_json = False
    assert (fast is not None) == (len(lines) >= 2 and first_is_json)


def test_iter_body_pauses_while_it_scans_lines_that_are_not_json():
    """A body whose lines are not JSON until its last is scanned SCAN_SLICE lines at a
    time: the caller gets a TURN between slices before any part, and then every line."""
    from protoflask.core.bodies import SCAN_SLICE, TURN, iter_body

    env = orjson.dumps(ENV)
    lines = [b"x"] * (3 * SCAN_SLICE) + [env]
    out = list(iter_body(b"\n".join(lines)))
    turns = [i for i, p in enumerate(out) if p is TURN]
    assert len(turns) == 3 and turns == list(range(3))
    assert [p for p in out if p is not TURN] == [(b"x", 1)] * (3 * SCAN_SLICE) + [
        (ENV, len(env))]

