from __future__ import annotations

from typing import Any, Callable, Iterator

import gevent
import pytest

from protoflask import ProtoServer
from protoflask.client import Client

from ..support import timeout

TRANSPORTS = ("ws", "sse", "stream")

SLOW = {"type": "object", "properties": {"steps": {"type": "integer"}}, "required": ["steps"]}


def add_tools(server: ProtoServer) -> None:
    """``slow`` reports progress per step; ``broken`` raises."""

    @server.tool(input_schema=SLOW)
    def slow(params, session_id, call_id, srv):
        """Reports progress per step."""
        for step in range(1, params["steps"] + 1):
            gevent.sleep(0.01)
            srv.send_tool_update(session_id, call_id, "RUNNING", 100 * step // params["steps"])
        return {"steps": params["steps"]}

    @server.tool()
    def broken(params, session_id, call_id, srv):
        """Always fails."""
        raise RuntimeError("kaput")


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def connect_client(transport: str) -> Iterator[Callable[..., Client]]:
    """Connected protoflask.client Clients of the current transport, closed after the test."""
    clients: list[Client] = []

    def make(server: ProtoServer, token: str | None = "default", **options: Any) -> Client:
        if token == "default":
            token = server.issue_token("alice")
        options.setdefault("transport", transport)
        options.setdefault("timeout", timeout(5))
        client = Client(server.base_url, token, **options)  # type: ignore[attr-defined]
        clients.append(client)
        return client.connect()

    try:
        yield make
    finally:
        for client in clients:
            client.close(flush_timeout=1)
