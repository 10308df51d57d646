"""/proto/mcp driven by the official MCP Python SDK's client (``mcp``: streamable_http_client
+ ClientSession): the tool list, add and echo, a slow tool's every progress notification,
cancellation (the tool's cancel hook and the native TOOL_DONE CANCELLED), a schema error as
a tool error, the list following register/unregister, and a refused token."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import requests

from protoflask import Tool

from ..support import timeout, wait_for
from .conftest import STEPS, mcp_session, mcp_url, wait_cancelled

mcp = pytest.importorskip("mcp")


def test_lists_exactly_the_registered_tools(app_server):
    server, _ = app_server
    token = server.issue_token("alice")

    async def main() -> Any:
        async with mcp_session(mcp_url(server), token) as session:
            return await session.list_tools()

    listed = anyio.run(main)
    registered = {t.name: t.to_dict() for t in server.get_tools()}
    assert {t.name for t in listed.tools} == set(registered) == {"echo", "add", "slow", "wait"}
    for tool in listed.tools:
        assert tool.description == registered[tool.name]["description"]
        assert tool.input_schema == registered[tool.name]["inputSchema"]
        assert tool.output_schema == registered[tool.name]["outputSchema"]


def test_add_and_echo_return_content_and_structured_content(app_server):
    server, _ = app_server
    token = server.issue_token("alice")

    async def main() -> Any:
        async with mcp_session(mcp_url(server), token) as session:
            return (await session.call_tool("add", {"a": 2, "b": 40}),
                    await session.call_tool("echo", {"message": "héllo"}))

    added, echoed = anyio.run(main)
    assert not added.is_error and added.structured_content == {"result": 42}
    assert added.content[0].type == "text" and added.content[0].text == '{"result":42}'
    assert not echoed.is_error and echoed.structured_content == {"echoed": "héllo"}
    assert server.get_stats()["totalMessages"] >= 2  # went through the session's pipeline


def test_slow_tool_sends_every_progress_notification(app_server):
    server, _ = app_server
    token = server.issue_token("alice")
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def main() -> Any:
        async with mcp_session(mcp_url(server), token) as session:
            return await session.call_tool("slow", {"steps": STEPS},
                                           progress_callback=on_progress)

    result = anyio.run(main)
    assert result.structured_content == {"counted": STEPS}
    assert seen == [(100 * s / STEPS, 100, f"step {s}") for s in range(1, STEPS + 1)]


def test_cancel_runs_the_cancel_hook_and_sends_native_tool_done_cancelled(app_server):
    server, app = app_server
    token = server.issue_token("alice")
    progressed = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        progressed.set()

    async def main() -> None:
        async with mcp_session(mcp_url(server), token) as session:
            async with anyio.create_task_group() as tasks:
                async def call() -> None:
                    await session.call_tool("wait", {}, progress_callback=on_progress)
                tasks.start_soon(call)
                with anyio.fail_after(timeout(10)):
                    await progressed.wait()
                tasks.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            # the session is still usable after a cancelled call
            assert (await session.call_tool("add", {"a": 1, "b": 1})).structured_content \
                == {"result": 2}
            await anyio.to_thread.run_sync(lambda: wait_cancelled(app, server))

    anyio.run(main)
    call_id, done = wait_cancelled(app, server)
    assert app.cancelled == [call_id]
    assert done == [{"call_id": call_id, "status": "CANCELLED"}]


def test_schema_error_is_a_tool_error(app_server):
    server, _ = app_server
    token = server.issue_token("alice")

    async def main() -> Any:
        async with mcp_session(mcp_url(server), token) as session:
            return (await session.call_tool("add", {"a": "two", "b": 1}),
                    await session.call_tool("slow", {}))

    wrong_type, missing = anyio.run(main)
    assert wrong_type.is_error and wrong_type.structured_content is None
    assert wrong_type.content[0].text.startswith("INVALID_MESSAGE: params.a:")
    assert missing.is_error and "'steps' is a required property" in missing.content[0].text


def test_unknown_tool_is_a_protocol_error(app_server):
    server, _ = app_server
    token = server.issue_token("alice")
    from mcp.shared.exceptions import MCPError

    async def main() -> None:
        async with mcp_session(mcp_url(server), token) as session:
            with pytest.raises(MCPError) as caught:
                await session.call_tool("nope", {})
            assert caught.value.code == -32602

    anyio.run(main)


def test_list_follows_register_and_unregister_with_list_changed(app_server):
    server, _ = app_server
    token = server.issue_token("alice")
    notified = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            notified.set()

    async def main() -> tuple[set[str], set[str]]:
        async with mcp_session(mcp_url(server), token, message_handler=on_message) as session:
            caps = session.initialize_result.capabilities
            assert caps.tools is not None and caps.tools.list_changed
            await anyio.sleep(0)  # let the SDK open its GET stream
            with anyio.fail_after(timeout(10)):
                while True:  # the GET stream may open after this first registration
                    server.register_tool(Tool("late", "Registered later.", {"type": "object"},
                                              execute=lambda *_: {}))
                    with anyio.move_on_after(0.2):
                        await notified.wait()
                    if notified.is_set():
                        break
            with_late = {t.name for t in (await session.list_tools()).tools}
            server.unregister_tool("late")
            without = {t.name for t in (await session.list_tools()).tools}
            return with_late, without

    with_late, without = anyio.run(main)
    assert "late" in with_late and "late" not in without


def test_refused_token_is_401(app_server):
    server, _ = app_server
    from mcp.shared.exceptions import MCPError

    async def main() -> None:
        async with mcp_session(mcp_url(server), "not-a-token"):
            pass

    with pytest.raises(Exception) as caught:
        anyio.run(main)
    # the SDK reports the refused initialize as an MCPError (inside its task groups)
    assert isinstance(caught.value, MCPError) or caught.group_contains(MCPError)
    resp = requests.post(mcp_url(server), json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                         headers={"Authorization": "Bearer not-a-token"}, timeout=timeout(5))
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "INVALID_TOKEN"
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    missing = requests.post(mcp_url(server), json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                            timeout=timeout(5))
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "MISSING_TOKEN"


def test_session_ends_on_delete(app_server):
    server, _ = app_server
    token = server.issue_token("alice")

    async def main() -> None:
        async with mcp_session(mcp_url(server), token) as session:
            await session.list_tools()
        # leaving the context sent DELETE: the link is gone, the session kept for resume

    anyio.run(main)
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, 10, "the link to close")


def test_the_sdk_high_level_client_probes_then_initializes(app_server):
    """mcp.Client in its default mode ("auto") first probes the stateless 2026-07-28
    revision (server/discover), which is not served: the -32601 sends it to initialize.
    Its URL carries the token (a client that cannot set headers)."""
    server, _ = app_server
    from mcp import Client

    async def main() -> tuple[str, Any]:
        url = f"{mcp_url(server)}?token={server.issue_token('alice')}"
        async with Client(url) as client:
            return client.protocol_version, await client.call_tool("add", {"a": 1, "b": 2})

    version, added = anyio.run(main)
    assert version == "2025-11-25"
    assert added.structured_content == {"result": 3}


def test_a_user_over_the_memory_budget_is_refused_a_new_session(make_server):
    """A new MCP session meets the memory budget as a new WebSocket session does
    (docs/MCP.md): while a user's sessions hold more than maxUserBytes, the SDK's
    initialize is refused (503 USER_CONNECTION_LIMIT); another user's is not."""
    from mcp.shared.exceptions import MCPError

    from ..support import hold_over_budget

    server = make_server(allowedOrigins=["*"])
    alice, client = hold_over_budget(server, "alice")
    try:
        async def tools(token: str) -> Any:
            async with mcp_session(mcp_url(server), token) as session:
                return await session.list_tools()

        with pytest.raises(Exception) as caught:
            anyio.run(tools, alice)
        assert isinstance(caught.value, MCPError) or caught.group_contains(MCPError)
        refused = requests.post(
            mcp_url(server), timeout=timeout(5),
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "raw", "version": "0"}}},
            headers={"Authorization": f"Bearer {alice}",
                     "Accept": "application/json, text/event-stream"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "USER_CONNECTION_LIMIT"
        assert anyio.run(tools, server.issue_token("bob")).tools  # bob is not held to it
    finally:
        client.close()
