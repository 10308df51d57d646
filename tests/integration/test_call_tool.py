"""``server.call_tool``: the application's own agent runs a registered tool inside a
session (and run); the client sees it like one of its own calls."""

from __future__ import annotations

import threading
from typing import Any, Callable

import gevent
import pytest

from protoflask import ProtoError, ProtoServer, ToolCancelled

from ..support import WSClient, wait_for

SLOW = {"type": "object", "properties": {"steps": {"type": "integer"}}, "required": ["steps"]}


def add_tools(server: ProtoServer) -> None:
    @server.tool(input_schema=SLOW)
    def slow(params, session_id, call_id, srv):
        """Reports progress per step."""
        for step in range(1, params["steps"] + 1):
            gevent.sleep(0.02)
            srv.send_tool_update(session_id, call_id, "RUNNING", 100 * step // params["steps"])
        return {"steps": params["steps"]}

    @server.tool()
    def broken(params, session_id, call_id, srv):
        raise RuntimeError("kaput")


class InThread:
    """call_tool from another thread, so the test can act while it blocks."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self) -> "InThread":
        wait_for(lambda: not self.thread.is_alive(), what="call_tool to return")
        return self


@pytest.fixture
def session(make_server) -> tuple[ProtoServer, WSClient, str]:
    server = make_server()
    add_tools(server)
    client = WSClient(server.base_url, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    yield server, client, sid
    client.close()


def test_returns_the_result_and_the_client_sees_the_call(session) -> None:
    server, client, sid = session
    run = server.start_run(sid)
    result = server.call_tool(sid, "slow", {"steps": 3}, run_id=run["runId"], call_id="a1")
    assert result == {"steps": 3}
    done = client.recv_type("TOOL_DONE", call_id="a1")
    assert done["payload"] == {"call_id": "a1", "status": "OK", "result": {"steps": 3}}
    progress = [m["payload"]["progress"] for m in client.received
                if m["type"] == "TOOL_UPDATE" and m["payload"]["call_id"] == "a1"]
    assert progress == [33, 66, 100]
    # a generated call_id when none is given; inline built-ins work too
    assert server.call_tool(sid, "add", {"a": 1, "b": 2}) == {"result": 3}
    auto = client.recv_type("TOOL_DONE")
    assert auto["payload"]["call_id"].startswith("agent-")


def test_from_a_greenlet_in_the_server(session) -> None:
    server, client, sid = session
    results: list = []
    # a signal receiver runs in the server's hub: the agent's usual place
    server.on("runStarted", lambda s, run: gevent.spawn(
        lambda: results.append(server.call_tool(s, "slow", {"steps": 2}, run_id=run.run_id))))
    client.send("RUN_STARTED", "USER", {"run_id": "r1"})
    client.recv_type("TOOL_DONE")
    wait_for(lambda: results == [{"steps": 2}], what="the agent greenlet's result")


@pytest.mark.parametrize("name,params,run_id,code", [
    ("nope", {}, None, "TOOL_NOT_FOUND"),
    ("slow", {"steps": "x"}, None, "INVALID_MESSAGE"),
    ("slow", {"steps": 1}, "no-such-run", "RUN_NOT_FOUND"),
])
def test_refused_before_anything_is_sent(session, name, params, run_id, code) -> None:
    server, client, sid = session
    with pytest.raises(ProtoError) as info:
        server.call_tool(sid, name, params, run_id=run_id)
    assert info.value.code == code
    client.send("PING", "SYSTEM", {"nonce": "n"})
    client.recv_type("PONG")
    assert [m["type"] for m in client.received] == ["HELLO", "PONG"]


def test_a_failing_tool_raises_its_error(session) -> None:
    server, client, sid = session
    with pytest.raises(ProtoError) as info:
        server.call_tool(sid, "broken", call_id="b1")
    assert info.value.code == "TOOL_EXECUTION_ERROR" and "kaput" in info.value.message
    done = client.recv_type("TOOL_DONE", call_id="b1")["payload"]
    assert done["status"] == "ERROR" and done["error"]["code"] == "TOOL_EXECUTION_ERROR"


def test_duplicate_call_id_is_refused(session) -> None:
    server, client, sid = session
    running = InThread(lambda: server.call_tool(sid, "slow", {"steps": 20}, call_id="d1"))
    client.recv_type("TOOL_UPDATE", call_id="d1")
    with pytest.raises(ProtoError) as info:
        server.call_tool(sid, "slow", {"steps": 1}, call_id="d1")
    assert info.value.code == "DUPLICATE_CALL_ID"
    client.send("TOOL_CANCEL", "USER", {"call_id": "d1"})
    assert isinstance(running.join().error, ToolCancelled)


@pytest.mark.parametrize("how", ["TOOL_CANCEL", "RUN_CANCEL"])
def test_a_cancelled_call_raises_tool_cancelled(session, how) -> None:
    server, client, sid = session
    run_id = server.start_run(sid)["runId"]
    running = InThread(lambda: server.call_tool(sid, "slow", {"steps": 50}, run_id=run_id,
                                                call_id="k1"))
    client.recv_type("TOOL_UPDATE", call_id="k1")
    if how == "TOOL_CANCEL":
        client.send("TOOL_CANCEL", "USER", {"call_id": "k1"})
    else:
        client.send("RUN_CANCEL", "USER", {"run_id": run_id})
    assert isinstance(running.join().error, ToolCancelled)
    done = client.recv_type("TOOL_DONE", call_id="k1")
    assert done["payload"]["status"] == "CANCELLED"
    client.send("PING", "SYSTEM", {"nonce": "after"})
    client.recv_type("PONG", nonce="after")
    assert [m for m in client.received if m["type"] == "TOOL_DONE"] == [done]  # just one
