"""/proto/mcp on a two-node Redis cluster (the shared Redis, this test's key prefix): the
MCP session starts on node a, its calls land on node b, and its cancellation on node a
again; both official clients, each request sent to the node the test chooses."""

from __future__ import annotations

import json
from typing import Any, Callable

import anyio
import pytest

from protoflask import ProtoServer

from ..support import timeout, wait_for
from .conftest import STEPS, App, mcp_url, native_done
from .test_node_client import node_client  # noqa: F401 - the fixture

mcp = pytest.importorskip("mcp")


@pytest.fixture
def nodes(make_server: Callable[..., ProtoServer], redis_url: str,
          prefix: str) -> tuple[ProtoServer, ProtoServer, App]:
    app = App()
    pair = []
    for _ in range(2):
        node = make_server(redisUrl=redis_url, redisPrefix=prefix, allowedOrigins=["*"])
        app.install(node)
        pair.append(node)
    return pair[0], pair[1], app


def cancelled_on_cluster(app: App, *nodes: ProtoServer) -> tuple[str, list[Any]]:
    """The cancelled call and its native TOOL_DONEs, from whichever node holds the session."""
    call_id = wait_for(lambda: app.cancelled and app.cancelled[0], 10, "the cancel hook")
    session_id = app.calls[call_id]
    done = wait_for(lambda: next((d for n in nodes if (d := native_done(n, session_id,
                                                                        call_id))), None),
                    10, "the native TOOL_DONE")
    return call_id, done


def test_python_sdk_calls_land_on_another_node(nodes):
    a, b, app = nodes
    token = a.issue_token("alice")
    landed: list[tuple[str, str]] = []
    progress: list[tuple[float, str | None]] = []

    async def route(request: Any) -> None:
        """initialize and cancellations to node a, every other request to node b."""
        body = request.content if request.method == "POST" else b""
        method = json.loads(body).get("method", "") if body else request.method
        node = a if method in ("initialize", "notifications/cancelled") else b
        request.url = request.url.copy_with(port=node.port)
        landed.append((method, "a" if node is a else "b"))

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def main() -> Any:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        started = anyio.Event()

        async def on_wait_progress(*_: Any) -> None:
            started.set()

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=timeout(30),
                                      event_hooks={"request": [route]}) as http:
            async with streamable_http_client(mcp_url(a), http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    names = {t.name for t in (await session.list_tools()).tools}
                    added = await session.call_tool("add", {"a": 2, "b": 40})
                    echoed = await session.call_tool("echo", {"message": "b"})
                    slow = await session.call_tool("slow", {"steps": STEPS},
                                                   progress_callback=on_progress)
                    schema = await session.call_tool("add", {"a": "x", "b": 1})
                    async with anyio.create_task_group() as tasks:
                        async def call() -> None:
                            await session.call_tool("wait", {},
                                                    progress_callback=on_wait_progress)
                        tasks.start_soon(call)
                        with anyio.fail_after(timeout(10)):
                            await started.wait()
                        tasks.cancel_scope.cancel()
                    await anyio.to_thread.run_sync(lambda: cancelled_on_cluster(app, a, b))
                    after = await session.call_tool("add", {"a": 1, "b": 1})
                    return names, added, echoed, slow, schema, after

    names, added, echoed, slow, schema, after = anyio.run(main)
    assert ("initialize", "a") in landed and ("tools/call", "b") in landed
    assert ("notifications/cancelled", "a") in landed
    assert names == {"echo", "add", "slow", "wait"}
    assert added.structured_content == {"result": 42}
    assert echoed.structured_content == {"echoed": "b"}
    assert slow.structured_content == {"counted": STEPS}
    assert progress == [(100 * s / STEPS, f"step {s}") for s in range(1, STEPS + 1)]
    assert schema.is_error and schema.content[0].text.startswith("INVALID_MESSAGE")
    assert after.structured_content == {"result": 2}
    call_id, done = cancelled_on_cluster(app, a, b)
    assert app.cancelled == [call_id]
    assert done == [{"call_id": call_id, "status": "CANCELLED"}]
    assert app.ran_on == {"slow": [b.port], "wait": [b.port]}  # not the session's node


def test_node_sdk_calls_land_on_another_node(nodes, node_client):  # noqa: F811
    a, b, app = nodes
    # the script's initialize goes to a (its URL); the NODE_B variable sends the rest to b
    expect = node_client("calls", mcp_url(a), a.issue_token("node"), mcp_url(b))
    expect("connected")
    assert expect("add")["result"]["structuredContent"] == {"result": 42}
    slow = expect("slow")
    assert [p["progress"] for p in slow["progress"]] == \
        [100 * s / STEPS for s in range(1, STEPS + 1)]
    assert expect("wait")["outcome"] == "aborted"
    assert expect("after")["result"]["structuredContent"] == {"result": 2}
    expect("end")
    call_id, done = cancelled_on_cluster(app, a, b)
    assert done == [{"call_id": call_id, "status": "CANCELLED"}]
    assert app.ran_on == {"slow": [b.port], "wait": [b.port]}  # not the session's node
