"""What the MCP tests share: an application with a slow tool that reports progress and a
tool that waits to be cancelled (its cancel hook records the call), the native TOOL_DONEs
the session sent, and the official Python SDK's client session on /proto/mcp."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import gevent
import pytest

from protoflask import ProtoServer, Tool, signals

from ..support import timeout, wait_for

STEPS = 5


@dataclass
class App:
    """What the test application's tools and listeners saw."""

    #: call_id -> the session it ran in (toolCall signal)
    calls: dict[str, str] = field(default_factory=dict)
    #: the call_ids whose cancel hook ran
    cancelled: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    #: tool name -> the ports of the servers (nodes) its calls ran on
    ran_on: dict[str, list[int]] = field(default_factory=dict)

    def install(self, server: ProtoServer) -> None:
        server.register_tool(Tool(
            "slow", "Counts to `steps`, reporting each step as progress.",
            {"type": "object", "properties": {"steps": {"type": "integer", "minimum": 1}},
             "required": ["steps"]},
            {"type": "object", "properties": {"counted": {"type": "integer"}},
             "required": ["counted"]},
            self._slow))
        server.register_tool(Tool(
            "wait", "Reports one step, then waits until it is cancelled.",
            {"type": "object"}, {"type": "object"}, self._wait))
        signals.tool_call.connect(self._on_call, sender=server, weak=False)

    def _on_call(self, sender: Any, session_id: str, execution: Any) -> None:
        self.calls[execution.call_id] = session_id

    def _slow(self, params: dict[str, Any], session_id: str, call_id: str, server: Any) -> Any:
        self.ran_on.setdefault("slow", []).append(server.port)
        steps = params["steps"]
        for step in range(1, steps + 1):
            server.send_tool_update(session_id, call_id, "RUNNING", 100 * step / steps,
                                    partial=f"step {step}")
            gevent.sleep(0.01)
        return {"counted": steps}

    def _wait(self, params: Any, session_id: str, call_id: str, server: Any) -> Any:
        self.ran_on.setdefault("wait", []).append(server.port)
        server.send_tool_update(session_id, call_id, "RUNNING", 10, partial="waiting")
        self.started.set()
        try:
            gevent.sleep(timeout(60))
        except gevent.GreenletExit:  # the cancel hook: TOOL_CANCEL kills the greenlet
            self.cancelled.append(call_id)
            raise
        return {}


def native_done(server: ProtoServer, session_id: str, call_id: str) -> list[dict[str, Any]]:
    """The TOOL_DONE payloads the session sent for ``call_id`` (its replay window)."""
    session = server.get_session(session_id) or {}
    return [m["payload"] for m in (session.get("replayWindow") or {}).values()
            if m["type"] == "TOOL_DONE" and m["payload"]["call_id"] == call_id]


def wait_cancelled(app: App, server: ProtoServer, within: float = 10) -> tuple[str, list[Any]]:
    """The cancelled call's id once its hook ran, and its native TOOL_DONEs."""
    call_id = wait_for(lambda: app.cancelled and app.cancelled[0], within, "the cancel hook")
    session_id = app.calls[call_id]
    done = wait_for(lambda: native_done(server, session_id, call_id), within,
                    "the native TOOL_DONE")
    return call_id, done


@pytest.fixture
def app_server(make_server: Callable[..., ProtoServer]) -> tuple[ProtoServer, App]:
    server = make_server(allowedOrigins=["*"])
    app = App()
    app.install(server)
    return server, app


def mcp_url(server: ProtoServer) -> str:
    return f"{server.base_url}/proto/mcp"  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str, **session_kwargs: Any) -> AsyncIterator[Any]:
    """An initialized ClientSession of the official SDK on ``url`` with the token."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=timeout(30)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, **session_kwargs) as session:
                await session.initialize()
                yield session
