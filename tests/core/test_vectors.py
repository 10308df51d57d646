"""Golden envelope files in tests/vectors (see tests/vectors/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protoflask.core.envelope import CLIENT_TYPES, parse
from protoflask.core.errors import ERRORS_BY_CODE, ProtoError
from protoflask.core.session import ErrorSent

from ._support import Client, make_session, receive_events

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
MAX_SIZE = 4096
VALID = sorted((VECTORS / "valid").glob("*.json"))
INVALID = sorted((VECTORS / "invalid").glob("*.json"))

#: Codes that mean "the envelope or its payload was rejected".
VALIDATION_CODES = {"INVALID_MESSAGE", "UNSUPPORTED_TYPE", "MISSING_RUN_ID", "MESSAGE_TOO_LARGE"}


def expected_code(path: Path) -> str:
    return path.name.split(".")[-2]


def test_there_are_vectors():
    assert len(VALID) >= 20 and len(INVALID) >= 20


def test_valid_vectors_cover_every_client_type():
    seen = {json.loads(p.read_bytes())["type"] for p in VALID}
    assert seen == CLIENT_TYPES


def test_invalid_vector_names_carry_a_known_code():
    for path in INVALID:
        assert expected_code(path) in ERRORS_BY_CODE, path.name


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_vector_parses(path):
    data = path.read_bytes()
    wire = json.loads(data)
    msg = parse(data, max_size=MAX_SIZE)
    assert (msg.id, msg.session, msg.type, msg.channel) == (
        wire["id"], wire["session"], wire["type"], wire["channel"])
    assert msg.seq == int(wire["seq"]) and msg.ts == int(wire["ts"])
    assert set(wire["payload"]) <= set(msg.payload)


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_vector_is_accepted_by_a_session(path):
    wire = json.loads(path.read_bytes())
    s = make_session(max_message_size=MAX_SIZE, greeted=wire["type"] != "HELLO")
    if wire["type"] in ("MESSAGE_PART", "MESSAGE_END"):
        # PART/END need an open text (else INVALID_MESSAGE for the unknown message_id).
        assert int(wire["seq"]) > 1
        start = {**wire, "seq": "1", "type": "MESSAGE_START",
                 "payload": {"message_id": wire["payload"]["message_id"],
                             "content_type": "text/plain"}}
        assert receive_events(s, json.dumps(start), 0)
    events = receive_events(s, path.read_bytes(), 0)
    codes = {e.error.code for e in events if isinstance(e, ErrorSent)}
    assert not codes & VALIDATION_CODES, codes


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_vector_is_rejected_with_its_code(path):
    with pytest.raises(ProtoError) as info:
        parse(path.read_bytes(), max_size=MAX_SIZE)
    assert info.value.code == expected_code(path)


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_vector_gets_one_error_message_from_a_session(path):
    s = make_session(max_message_size=MAX_SIZE, greeted=True)
    receive_events(s, path.read_bytes(), 0)
    out = Client(s).take()
    assert [(m["type"], m["payload"]["code"]) for m in out] == [
        ("ERROR", expected_code(path))]
    try:
        wire = json.loads(path.read_bytes())
    except ValueError:
        wire = None
    usable_id = (isinstance(wire, dict) and isinstance(wire.get("id"), str) and wire["id"]
                 and expected_code(path) != "MESSAGE_TOO_LARGE")
    if usable_id:
        assert out[0]["payload"]["related_id"] == wire["id"]
    else:
        assert "related_id" not in out[0]["payload"]
