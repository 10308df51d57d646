"""Params that fail a tool's inputSchema: the answer names the field and the reason, on
the wire (ERROR and TOOL_DONE) and in the Python client's ToolError, and stays bounded
however wrong the params are."""

from __future__ import annotations

import pytest

from protoflask.client import ToolError
from protoflask.tools import MAX_SCHEMA_ERROR_CHARS, MAX_SCHEMA_ERRORS

from ..support import WSClient

ITEMS = {"type": "object", "required": ["items"],
         "properties": {"items": {"type": "array", "items": {"type": "integer"}},
                        "label": {"type": "string", "maxLength": 3}}}


def test_the_client_gets_the_field_and_the_reason(make_server, connect_client):
    server = make_server()
    client = connect_client(server)
    with pytest.raises(ToolError) as caught:
        client.call_tool("add", {"a": "x", "b": 2})
    error = caught.value
    assert error.code == "INVALID_MESSAGE"
    assert error.message == "params.a: 'x' is not of type 'number' (inputSchema of 'add')"
    assert error.detail == [{"path": "a", "message": "'x' is not of type 'number'"}]

    with pytest.raises(ToolError) as missing:
        client.call_tool("add", {"a": 1})
    assert missing.value.message.startswith("params: 'b' is a required property")
    assert missing.value.detail == [{"path": "", "message": "'b' is a required property"}]


def test_many_errors_are_bounded_and_truncated(make_server):
    server = make_server()

    @server.tool(input_schema=ITEMS)
    def count(params, *_):
        """Counts items."""
        return {"n": len(params["items"])}

    with WSClient(server.base_url, server.issue_token("alice")) as client:
        client.hello()
        params = {"items": ["x" * 1000] * 500, "label": "too long"}
        client.send("TOOL_CALL", "USER", {"call_id": "c1", "tool": "count", "params": params})
        done = client.recv_type("TOOL_DONE", call_id="c1")["payload"]
        error = client.expect_error("INVALID_MESSAGE")["payload"]
    assert done["status"] == "ERROR" and done["error"]["detail"] == error["detail"]
    detail = error["detail"]
    assert len(detail) == MAX_SCHEMA_ERRORS
    assert all(len(d["message"]) <= MAX_SCHEMA_ERROR_CHARS for d in detail)
    assert detail[0]["path"] == "items/0" and detail[0]["message"].endswith("...")
    assert error["message"].startswith("params.items[0]: 'xxx")
    assert error["message"].endswith("(and more errors; inputSchema of 'count')")
    assert len(error["message"]) < 2 * MAX_SCHEMA_ERROR_CHARS
