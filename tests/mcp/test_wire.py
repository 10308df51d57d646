"""/proto/mcp on the raw wire, every message checked against the published wire types
(``mcp.types``): version negotiation per revision, MCP's own JSON-RPC errors for what is
not served, the transport's status codes (400, 403, 404, 406), progress over SSE, the GET
stream, and DELETE."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
import requests
from pydantic import TypeAdapter

import gevent

from protoflask import Tool

from ..support import timeout, wait_for
from .conftest import STEPS, App, mcp_url, native_done

types = pytest.importorskip("mcp.types")
MESSAGE = TypeAdapter(types.JSONRPCMessage)
ACCEPT = "application/json, text/event-stream"


class Wire:
    """One MCP session on the raw wire."""

    def __init__(self, server: Any, version: str | None = "2025-11-25", **headers: str) -> None:
        self.url = mcp_url(server)
        self.headers = {"Authorization": f"Bearer {server.issue_token('wire')}",
                        "Accept": ACCEPT, **headers}
        self.version = version
        self.session_id: str | None = None
        self.ids = iter(range(1, 10_000))

    def post(self, body: Any, **headers: str) -> requests.Response:
        sent = dict(self.headers)
        if self.session_id:
            sent["Mcp-Session-Id"] = self.session_id
        if self.version and self.session_id:
            sent["MCP-Protocol-Version"] = self.version
        sent.update(headers)
        return requests.post(self.url, data=json.dumps(body), headers=sent,
                             timeout=timeout(10), stream=True)

    def request(self, method: str, params: dict[str, Any] | None = None,
                **headers: str) -> requests.Response:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self.ids), "method": method}
        if params is not None:
            body["params"] = params
        return self.post(body, **headers)

    def initialize(self, version: str) -> Any:
        resp = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                           "clientInfo": {"name": "raw", "version": "0"}})
        assert resp.status_code == 200, resp.text
        self.session_id = resp.headers["Mcp-Session-Id"]
        message = MESSAGE.validate_python(resp.json())
        assert isinstance(message, types.JSONRPCResponse)
        result = types.InitializeResult.model_validate(message.result)
        note = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202
        return result

    def result(self, resp: requests.Response) -> dict[str, Any]:
        assert resp.status_code == 200, resp.text
        message = MESSAGE.validate_python(resp.json())
        assert isinstance(message, types.JSONRPCResponse), message
        return message.result

    def error(self, resp: requests.Response) -> Any:
        message = MESSAGE.validate_python(resp.json())
        assert isinstance(message, types.JSONRPCError), message
        return message.error


def sse_messages(resp: requests.Response) -> Iterator[Any]:
    """The JSON-RPC messages of an SSE response, each validated."""
    for block in resp.iter_content(chunk_size=None, decode_unicode=False):
        for event in block.split(b"\n\n"):
            data = [line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")]
            if data:
                yield MESSAGE.validate_python(json.loads(b"\n".join(data)))


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
def test_each_served_revision_is_negotiated(app_server, version):
    server, _ = app_server
    wire = Wire(server, version if version >= "2025-06-18" else None)
    init = wire.initialize(version)
    assert init.protocol_version == version and init.capabilities.tools.list_changed
    listed = types.ListToolsResult.model_validate(wire.result(wire.request("tools/list")))
    echo = next(t for t in listed.tools if t.name == "echo")
    called = types.CallToolResult.model_validate(
        wire.result(wire.request("tools/call", {"name": "echo",
                                                "arguments": {"message": "v"}})))
    assert called.content[0].text == '{"echoed":"v"}'
    structured = version >= "2025-06-18"  # outputSchema and structuredContent arrive then
    assert (echo.output_schema is not None) is structured
    assert (called.structured_content == {"echoed": "v"}) is structured


def test_unknown_revision_gets_the_newest(app_server):
    server, _ = app_server
    assert Wire(server).initialize("2099-01-01").protocol_version == "2025-11-25"


def test_what_is_not_served_gets_mcp_errors(app_server):
    server, _ = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")
    for method in ("server/discover", "resources/list", "prompts/get"):
        assert wire.error(wire.request(method, {})).code == -32601
    older = Wire(server, "2025-06-18")  # Tasks arrive with 2025-11-25
    older.initialize("2025-06-18")
    assert older.error(older.request("tasks/get", {"taskId": "x"})).code == -32601
    assert wire.result(wire.request("ping")) == {}
    batch = wire.post([{"jsonrpc": "2.0", "id": 9, "method": "ping"}])
    assert batch.status_code == 400 and wire.error(batch).code == -32600
    garbage = wire.post("not json")  # a JSON string, not a message
    assert garbage.status_code == 400 and wire.error(garbage).code == -32600
    bad_json = requests.post(wire.url, data=b"{", headers=wire.headers, timeout=timeout(5))
    assert bad_json.status_code == 400 and wire.error(bad_json).code == -32700
    bad_version = wire.request("ping", **{"MCP-Protocol-Version": "1999-01-01"})
    assert bad_version.status_code == 400 and wire.error(bad_version).code == -32600
    no_name = wire.request("tools/call", {"arguments": {}})
    assert wire.error(no_name).code == -32602


def test_session_header_rules(app_server):
    server, _ = app_server
    wire = Wire(server)
    missing = wire.request("tools/list")
    assert missing.status_code == 400 and wire.error(missing).code == -32600
    wire.session_id = "0" * 32
    assert wire.request("tools/list").status_code == 404
    wire.initialize("2025-11-25")
    other = Wire(server)  # another user's token with this session's id
    other.headers["Authorization"] = f"Bearer {server.issue_token('mallory')}"
    other.session_id = wire.session_id
    assert other.request("tools/list").status_code == 404


def test_origin_check(make_server):
    same_only = make_server()  # no allowedOrigins: only the server's own origin
    wire = Wire(same_only)
    host = same_only.base_url.split("://", 1)[1]
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    refused = wire.post(body, Origin="http://evil.example")
    assert refused.status_code == 403 and wire.error(refused).code == -32600
    assert wire.post(body, Origin=f"http://{host}").status_code != 403
    listed = make_server(allowedOrigins=["https://app.example"])
    wire = Wire(listed)
    assert wire.post(body, Origin="https://app.example").status_code != 403
    assert wire.post(body, Origin=f"http://{host}").status_code == 403


def test_progress_over_sse_and_a_result_at_the_end(app_server):
    server, _ = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")
    resp = wire.request("tools/call", {"name": "slow", "arguments": {"steps": STEPS},
                                       "_meta": {"progressToken": "tok"}})
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith(
        "text/event-stream")
    messages = list(sse_messages(resp))
    notes = [types.ProgressNotification.model_validate(m.model_dump(by_alias=True))
             for m in messages[:-1]]
    assert [(n.params.progress, n.params.message) for n in notes] == \
        [(100 * s / STEPS, f"step {s}") for s in range(1, STEPS + 1)]
    assert all(n.params.progress_token == "tok" and n.params.total == 100 for n in notes)
    assert isinstance(messages[-1], types.JSONRPCResponse)
    assert types.CallToolResult.model_validate(messages[-1].result).structured_content == \
        {"counted": STEPS}


def test_get_stream_carries_list_changed_and_delete_ends_the_session(app_server):
    server, _ = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")
    headers = {**wire.headers, "Mcp-Session-Id": wire.session_id or ""}
    assert requests.get(wire.url, headers={**headers, "Accept": "application/json"},
                        timeout=timeout(5)).status_code == 406
    with requests.get(wire.url, headers=headers, stream=True, timeout=timeout(10)) as stream:
        assert stream.status_code == 200
        chunks = stream.iter_content(chunk_size=None)
        assert next(chunks).startswith(b":")  # open
        server.unregister_tool("slow")
        data = next(chunks)
        message = MESSAGE.validate_python(json.loads(data.split(b"data: ", 1)[1]))
        types.ToolListChangedNotification.model_validate(message.model_dump(by_alias=True))
    assert requests.delete(wire.url, headers=headers, timeout=timeout(5)).status_code == 200


def test_heartbeat_pings_are_answered_by_the_link(make_server):
    """The session's heartbeat PINGs the MCP link like any transport; the link answers,
    so the session survives many intervals (no timeout, no 404)."""
    server = make_server(heartbeatInterval=50, heartbeatTimeout=50)
    wire = Wire(server)
    wire.initialize("2025-11-25")
    session_id = wire.session_id
    wait_for(lambda: int((server.get_session(session_id or "") or {})
                         .get("lastDeliveredSeq") or 0) >= 10, 10, "ten PINGs")
    called = types.CallToolResult.model_validate(wire.result(wire.request(
        "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}})))
    assert called.structured_content == {"result": 3}
    assert (server.get_session(session_id or "") or {}).get("connected") is True


def test_limits_are_the_native_ones(make_server):
    """maxConcurrentRuns and the tool queue apply to MCP calls as to native ones: with one
    run and no queue, a second call while one runs is MAX_RUNS_EXCEEDED (a tool error).
    (The inline built-ins skip the pool, natively too.)"""
    server = make_server(maxConcurrentRuns=1, toolQueueSize=0)
    app = App()
    app.install(server)
    wire = Wire(server)
    wire.initialize("2025-11-25")
    first = wire.post({"jsonrpc": "2.0", "id": "first", "method": "tools/call",
                       "params": {"name": "wait", "arguments": {},
                                  "_meta": {"progressToken": 1}}})
    assert app.started.wait(timeout(10))
    second = types.CallToolResult.model_validate(wire.result(wire.request(
        "tools/call", {"name": "slow", "arguments": {"steps": 1}})))
    assert second.is_error and second.content[0].text.startswith("MAX_RUNS_EXCEEDED")
    wire.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": "first"}})
    assert [m for m in sse_messages(first) if isinstance(m, types.JSONRPCResponse)] == []
    assert wait_for(lambda: app.cancelled, 10, "the cancel hook")


def test_misbehaving_calls_get_answers_and_leave_the_session_working(app_server):
    """Arguments that are not an object, a JSON-RPC id of 300 kB, an envelope that would
    pass maxMessageSize: each is answered (never a hang, never a 500), and the session
    and its link still serve the next call."""
    server, _ = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")

    def call(request_id: Any, arguments: Any) -> Any:
        resp = wire.post({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                          "params": {"name": "echo", "arguments": arguments}})
        return types.CallToolResult.model_validate(wire.result(resp))

    for arguments in ("text", [1, 2], 5):
        refused = call(1, arguments)
        assert refused.is_error and refused.content[0].text.startswith("INVALID_MESSAGE")
    assert call("y" * 300_000, {"message": "long id"}).structured_content == \
        {"echoed": "long id"}
    limit = server.config.max_message_size
    # near the limit twice: the second runs out of byte credit, whose refusal restores
    # the channel's bytes (§5.1), and the link sends it again once
    for request_id in (20, 21):
        near = call(request_id, {"message": "z" * (limit // 2)})
        assert near.structured_content == {"echoed": "z" * (limit // 2)}
    # a body under maxMessageSize whose envelope would not be
    wrapper = len(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"message": ""}}}))
    over = call(2, {"message": "z" * (limit - wrapper - 10)})
    assert over.is_error and over.content[0].text.startswith("MESSAGE_TOO_LARGE")
    assert call(3, {"message": "after"}).structured_content == {"echoed": "after"}
    assert server.get_stats()["activeConnections"] == 1  # the same link throughout


def test_a_client_that_leaves_does_not_cancel(app_server):
    """MCP: disconnecting is not cancelling. A client drops the SSE response of a running
    call; the tool's next progress finds the response gone, and the call runs to its end:
    the session's TOOL_DONE is OK, the cancel hook never ran."""
    server, app = app_server
    release: list[bool] = []

    def hold(params: Any, session_id: str, call_id: str, srv: Any) -> Any:
        srv.send_tool_update(session_id, call_id, "RUNNING", 10, partial="holding")
        while not release:
            gevent.sleep(0.01)
        return {"finished": True}

    server.register_tool(Tool("hold", "Holds until released.", {"type": "object"},
                              {"type": "object"}, hold))
    wire = Wire(server)
    wire.initialize("2025-11-25")
    resp = wire.post({"jsonrpc": "2.0", "id": "left", "method": "tools/call",
                      "params": {"name": "hold", "arguments": {}, "_meta": {"progressToken": 7}}})
    first = next(sse_messages(resp))
    assert types.ProgressNotification.model_validate(first.model_dump(by_alias=True))
    resp.close()  # the client goes away
    call_id = 'mcp:"left"'
    session_id = app.calls[call_id]
    for progress in (20, 30):  # written to the response that is gone
        server.send_tool_update(session_id, call_id, "RUNNING", progress)
        assert wire.result(wire.request("ping")) == {}
    release.append(True)
    assert wait_for(lambda: native_done(server, session_id, call_id), 10, "the TOOL_DONE") == \
        [{"call_id": call_id, "status": "OK", "result": {"finished": True}}]
    assert app.cancelled == []
