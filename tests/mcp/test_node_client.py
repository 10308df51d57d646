"""/proto/mcp driven by the official MCP TypeScript SDK's client (tests/mcp/node, pinned by
its lockfile; Node in CI): tools/list, add and echo, a schema error as a tool error, every
progress notification of a slow tool, an aborted call (the tool's cancel hook and the
native TOOL_DONE CANCELLED), and a refused token."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from ..interop.conftest import LineProcess, missing, need_program
from .conftest import STEPS, mcp_url, wait_cancelled

NODE_DIR = Path(__file__).resolve().parent / "node"
SCRIPT = "client.mjs"


def need_node_sdk() -> str:
    """node >= 20 with tests/mcp/node's packages (npm ci when node_modules is absent)."""
    node = need_program("node", "nodejs")
    sdk = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk"
    if not sdk.is_dir():
        npm = need_program("npm", "npm")
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            missing(f"npm ci in {NODE_DIR} failed: {proc.stderr[-2000:]}")
    return node


@pytest.fixture
def node_client() -> Any:
    made: list[LineProcess] = []

    def start(*args: str) -> Callable[[str], dict[str, Any]]:
        proc = LineProcess([need_node_sdk(), SCRIPT, *args], cwd=NODE_DIR)
        made.append(proc)

        def expect(kind: str, within: float = 20) -> dict[str, Any]:
            line = proc.expect(lambda text: json.loads(text).get("kind") == kind, within,
                               f"a {kind!r} line")
            out: dict[str, Any] = json.loads(line)
            return out
        return expect

    yield start
    for proc in made:
        proc.stop()


def test_node_sdk_lists_calls_reports_progress_and_cancels(app_server, node_client):
    server, app = app_server
    expect = node_client("calls", mcp_url(server), server.issue_token("node"))
    assert expect("connected")["version"] == "2025-11-25"
    tools = {t["name"]: t for t in expect("tools")["tools"]}
    registered = {t.name: t.to_dict() for t in server.get_tools()}
    assert set(tools) == set(registered)
    for name, tool in tools.items():
        assert tool["inputSchema"] == registered[name]["inputSchema"]
        assert tool["outputSchema"] == registered[name]["outputSchema"]
    assert expect("add")["result"]["structuredContent"] == {"result": 42}
    assert expect("echo")["result"]["structuredContent"] == {"echoed": "node"}
    schema = expect("schema")["result"]
    assert schema["isError"] is True
    assert schema["content"][0]["text"].startswith("INVALID_MESSAGE: params.a:")
    slow = expect("slow")
    assert slow["result"]["structuredContent"] == {"counted": STEPS}
    assert [(p["progress"], p["total"], p["message"]) for p in slow["progress"]] == \
        [(100 * s / STEPS, 100, f"step {s}") for s in range(1, STEPS + 1)]
    assert expect("wait")["outcome"] == "aborted"
    assert expect("after")["result"]["structuredContent"] == {"result": 2}
    expect("end")
    call_id, done = wait_cancelled(app, server)
    assert app.cancelled == [call_id]
    assert done == [{"call_id": call_id, "status": "CANCELLED"}]


def test_node_sdk_refused_token(app_server, node_client):
    server, _ = app_server
    refused = node_client("refused", mcp_url(server), "not-a-token")("refused")
    assert refused["code"] == 401 or "401" in refused["message"]


def test_node_sdk_tasks(app_server, node_client):
    """The TypeScript SDK's experimental Tasks client (the one published client that
    speaks Tasks): callToolStream creates, polls and fetches a task; cancelTask ends one."""
    server, app = app_server
    expect = node_client("tasks", mcp_url(server), server.issue_token("node-tasks"))
    seen = expect("stream")["seen"]
    assert seen[0]["type"] == "taskCreated" and seen[0]["task"]["status"] == "working"
    assert seen[-2]["type"] == "taskStatus" and seen[-2]["task"]["status"] == "completed"
    assert seen[-1] == {"type": "result", "result": {
        "content": [{"type": "text", "text": '{"counted":5}'}], "isError": False,
        "structuredContent": {"counted": STEPS},
        "_meta": {"io.modelcontextprotocol/related-task": {
            "taskId": seen[0]["task"]["taskId"]}}}}
    task_id = expect("created")["task"]["taskId"]
    assert expect("cancelled")["task"]["status"] == "cancelled"
    assert expect("after")["task"]["status"] == "cancelled"
    listed = {t["taskId"]: t["status"] for t in expect("list")["tasks"]}
    assert listed == {seen[0]["task"]["taskId"]: "completed", task_id: "cancelled"}
    expect("end")
    call_id, done = wait_cancelled(app, server)
    assert call_id == f"mcp-task:{task_id}"
    assert done == [{"call_id": call_id, "status": "CANCELLED"}]
