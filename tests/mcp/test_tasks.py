"""MCP Tasks (2025-11-25) on the raw wire, checked with mcp.types: a task-augmented
tools/call answered at once, tasks/get until it is terminal, tasks/result with the call's
own answer, tasks/list, tasks/cancel (the tool's cancel hook, the native TOOL_DONE
CANCELLED), the errors the revision names; and on a two-node cluster, a task read on the
node that did not run it, after the node that ran it stopped."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from protoflask import ProtoServer

from ..support import wait_for
from .conftest import STEPS, App, native_done
from .test_wire import Wire

types = pytest.importorskip("mcp.types")


def create(wire: Wire, name: str, arguments: dict[str, Any]) -> Any:
    created = types.CreateTaskResult.model_validate(wire.result(wire.request(
        "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": 5000}})))
    assert created.task.status in ("working", "completed", "failed")
    return created.task


def get(wire: Wire, task_id: str) -> Any:
    return types.GetTaskResult.model_validate(wire.result(wire.request(
        "tasks/get", {"taskId": task_id})))


def test_task_lifecycle(app_server):
    server, _ = app_server
    wire = Wire(server)
    init = wire.initialize("2025-11-25")
    assert init.capabilities.tasks is not None
    assert init.capabilities.tasks.requests.tools.call is not None
    listed = types.ListToolsResult.model_validate(wire.result(wire.request("tools/list")))
    assert {t.execution.task_support for t in listed.tools} == {"optional"}

    task = create(wire, "slow", {"steps": STEPS})
    assert task.ttl == server.config.replay_window_time and task.poll_interval
    done = wait_for(lambda: (t := get(wire, task.task_id)).status == "completed" and t, 10,
                    "the task to complete")
    assert done.created_at == task.created_at and done.last_updated_at >= done.created_at
    result = wire.result(wire.request("tasks/result", {"taskId": task.task_id}))
    called = types.CallToolResult.model_validate(result)
    assert called.structured_content == {"counted": STEPS}
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == \
        {"taskId": task.task_id}
    tasks = types.ListTasksResult.model_validate(wire.result(wire.request("tasks/list")))
    assert [(t.task_id, t.status) for t in tasks.tasks] == [(task.task_id, "completed")]
    # a terminal task cannot be cancelled; an unknown one is invalid params
    again = wire.request("tasks/cancel", {"taskId": task.task_id})
    assert wire.error(again).code == -32602
    assert wire.error(wire.request("tasks/get", {"taskId": "nope"})).code == -32602


def test_failed_task_and_blocking_result(app_server):
    server, _ = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")
    failed = create(wire, "add", {"a": "x", "b": 1})  # the schema refuses it: failed
    state = get(wire, failed.task_id)
    assert state.status == "failed" and state.status_message.startswith("INVALID_MESSAGE")
    called = types.CallToolResult.model_validate(wire.result(wire.request(
        "tasks/result", {"taskId": failed.task_id})))
    assert called.is_error
    unknown = wire.request("tools/call", {"name": "nope", "arguments": {}, "task": {}})
    assert wire.error(unknown).code == -32602
    slow = create(wire, "slow", {"steps": STEPS})  # tasks/result waits for the end
    called = types.CallToolResult.model_validate(wire.result(wire.request(
        "tasks/result", {"taskId": slow.task_id})))
    assert called.structured_content == {"counted": STEPS}


def test_task_cancel(app_server):
    server, app = app_server
    wire = Wire(server)
    wire.initialize("2025-11-25")
    task = create(wire, "wait", {})
    assert app.started.wait(10)
    cancelled = types.CancelTaskResult.model_validate(wire.result(wire.request(
        "tasks/cancel", {"taskId": task.task_id})))
    assert cancelled.status == "cancelled"
    assert get(wire, task.task_id).status == "cancelled"
    call_id = wait_for(lambda: app.cancelled and app.cancelled[0], 10, "the cancel hook")
    assert call_id == f"mcp-task:{task.task_id}"
    assert native_done(server, app.calls[call_id], call_id) == \
        [{"call_id": call_id, "status": "CANCELLED"}]


@pytest.fixture
def cluster(make_server: Callable[..., ProtoServer], redis_url: str,
            prefix: str) -> tuple[ProtoServer, ProtoServer, App]:
    app = App()
    nodes = [make_server(redisUrl=redis_url, redisPrefix=prefix) for _ in range(2)]
    for node in nodes:
        app.install(node)
    return nodes[0], nodes[1], app


def test_task_outlives_the_node_that_ran_it(cluster):
    a, b, app = cluster
    on_a = Wire(a)
    on_a.initialize("2025-11-25")
    task = create(on_a, "slow", {"steps": STEPS})
    wait_for(lambda: get(on_a, task.task_id).status == "completed", 10, "completion on a")
    on_b = Wire(b)
    on_b.headers["Authorization"] = on_a.headers["Authorization"]  # the same user
    on_b.session_id = on_a.session_id
    a.stop()  # the node that ran the task and held the session is gone
    assert get(on_b, task.task_id).status == "completed"
    called = types.CallToolResult.model_validate(on_b.result(on_b.request(
        "tasks/result", {"taskId": task.task_id})))
    assert called.structured_content == {"counted": STEPS}
    assert app.ran_on == {"slow": [a.port]}
