"""The typed delivery operations: each applies itself to a core and crosses the wire
(encode -> JSON -> decode) unchanged, as a cluster hub sends them between nodes."""

from __future__ import annotations

import orjson
import pytest

from protoflask.core import messages
from protoflask.core.errors import ProtoError, ToolExecutionError
from protoflask.live import (
    OPERATIONS,
    FailCall,
    OpenCall,
    Operation,
    Send,
    ToolDone,
    ToolUpdate,
    decode_error,
    decode_operation,
    encode_operation,
)


def over_the_wire(op: Operation) -> Operation:
    return decode_operation(orjson.loads(orjson.dumps(encode_operation(op))))


def test_every_operation_is_registered_by_its_name() -> None:
    assert OPERATIONS == {"send": Send, "tool_update": ToolUpdate, "tool_done": ToolDone,
                          "fail_call": FailCall, "open_call": OpenCall}


def test_send_round_trip() -> None:
    out = messages.create("TEXT", {"text": "hé"}, "USER")
    back = over_the_wire(Send(out))
    assert isinstance(back, Send) and back.out.to_dict() == out.to_dict()
    assert encode_operation(Send(out)) == {"name": "send", "args": [out.to_dict()]}


@pytest.mark.parametrize("op", [
    ToolUpdate("c1", "RUNNING", 0.5, {"partial": [1, 2]}),
    ToolUpdate("c1", "RUNNING"),
    ToolDone("c1", "OK", {"answer": 42}),
    ToolDone("c1", "CANCELLED"),
    OpenCall("c1", "r1"),
    OpenCall("c1", None),
])
def test_plain_operations_round_trip(op: Operation) -> None:
    assert over_the_wire(op) == op


def test_errors_come_back_as_their_own_class() -> None:
    error = ToolExecutionError("boom", detail={"why": "x"}, related_id="m1")
    for op in (ToolDone("c1", "ERROR", None, error), FailCall("c1", error)):
        back = over_the_wire(op)
        got = back.error  # type: ignore[attr-defined]
        assert type(got) is ToolExecutionError
        assert got.to_payload() == error.to_payload()


def test_an_unknown_error_code_keeps_its_code() -> None:
    back = decode_error({"code": "SOMETHING_NEW", "message": "m"})
    assert type(back) is ProtoError and back is not None and back.code == "SOMETHING_NEW"
    assert decode_error(None) is None


def test_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_operation({"name": "launch", "args": []})
