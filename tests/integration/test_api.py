"""The programmatic API of a real, embedded server (docs/PROTOCOL.md §12, §4.4 Tools),
driven by a real WebSocket client.

Signal receivers and tools run in the server's thread (its gevent hub): receivers only
append to lists / queues, the test waits with ``wait_for``, and tools block with
``gevent.sleep``.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

import gevent
import jwt
import orjson
import pytest
import requests
from flask import Flask
from websockets.exceptions import ConnectionClosed

from protoflask import ProtoError, ProtoServer, ServerConfig, Tool, ToolExecution, signals
from protoflask.core.session import Run

from ..support import SECRET, Envelopes, WSClient, timeout, wait_for

BASE = {"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET, "enableLogging": False}


# -- helpers --------------------------------------------------------------------------


@pytest.fixture
def ws() -> Iterator[Callable[..., WSClient]]:
    """Real WebSocket clients, all closed after the test."""
    clients: list[WSClient] = []

    def make(server: ProtoServer, token: str | None = None, **query: Any) -> WSClient:
        token = token if token is not None else server.issue_token("alice")
        client = WSClient(f"http://127.0.0.1:{server.port}", token, **query)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def own_servers() -> Iterator[Callable[..., ProtoServer]]:
    """Servers the test constructs (and maybe stops) itself; stopped at the end if not."""
    made: list[ProtoServer] = []

    def make(config: Any = None, **kwargs: Any) -> ProtoServer:
        server = ProtoServer(BASE if config is None else config, **kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        if server._serving.running:
            server.stop()


class Recorder:
    """A blinker receiver: keeps ``(sender, kwargs)`` of every call (thread-safe append)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append((sender, kwargs))

    @property
    def kwargs(self) -> list[dict[str, Any]]:
        return [kw for _, kw in self.calls]


class Positional:
    """A ``server.on`` listener: keeps the positional arguments of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def call(client: WSClient, tool: str, params: Any, call_id: str, **extra: Any) -> dict:
    return client.send("TOOL_CALL", "USER",
                       {"call_id": call_id, "tool": tool, "params": params, **extra})


def barrier(client: WSClient, nonce: str = "barrier") -> None:
    """Everything the server queued before this PING has reached the client."""
    client.send("PING", "SYSTEM", {"nonce": nonce})
    client.recv_type("PONG", nonce=nonce)


def dones(client: WSClient, call_id: str) -> list[dict]:
    return [m for m in client.received
            if m["type"] == "TOOL_DONE" and m["payload"]["call_id"] == call_id]


def drain_until_closed(client: WSClient, within: float = 5.0) -> list[dict]:
    deadline = time.monotonic() + timeout(within)
    out: list[dict] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"connection not closed; got {[m['type'] for m in out]}")
        try:
            data = client.ws.recv(timeout=left)
        except ConnectionClosed:
            return out
        except TimeoutError:
            continue
        out.append(orjson.loads(data))


def tool(name: str, execute: Any = None, output_schema: dict | None = None,
         input_schema: dict | None = None, **kwargs: Any) -> Tool:
    return Tool(name=name, description=f"the {name} tool",
                input_schema=input_schema or {"type": "object"},
                output_schema=output_schema or {"type": "object"},
                execute=execute, **kwargs)


# -- construction, start, stop ------------------------------------------------------------


def test_construct_from_dict_start_returns_once_listening(own_servers) -> None:
    server = own_servers()
    assert server.port is None
    server.start()
    assert isinstance(server.port, int) and server.port > 0
    # no waiting: start() returned once the socket was listening
    resp = requests.get(f"http://127.0.0.1:{server.port}/health", timeout=timeout(5))
    assert resp.status_code == 200 and resp.json()["status"] == "ok"
    with pytest.raises(RuntimeError):
        server.start()


def test_construct_from_server_config(own_servers, ws) -> None:
    config = ServerConfig(port=0, host="127.0.0.1", jwt_secret=SECRET, enable_logging=False,
                          max_concurrent_runs=3)
    server = own_servers(config)
    assert server.config is config
    server.start()
    hello = ws(server).hello()
    assert hello["payload"]["capabilities"]["max_concurrent_runs"] == 3


def test_lifecycle_started_stopped_and_close_1001(own_servers, ws) -> None:
    server = own_servers()
    started, stopped = Recorder(), Recorder()
    signals.started.connect(started, sender=server)
    signals.stopped.connect(stopped, sender=server)
    on_started, on_stopped = Positional(), Positional()
    server.on("started", on_started)
    server.on("stopped", on_stopped)
    state: dict[str, bool] = {}

    def forever(params, session_id, call_id, srv):
        state["running"] = True
        try:
            gevent.sleep(30)
        except gevent.GreenletExit:
            state["killed"] = True
            raise
        return {}

    server.register_tool(tool("forever", forever))
    server.start()
    assert len(started.calls) == 1 and started.calls[0][0] is server
    assert on_started.calls == [()]
    assert stopped.calls == []

    first, second = ws(server), ws(server)
    first.hello()
    second.hello()
    call(first, "forever", {}, "f1")
    wait_for(lambda: state.get("running"), what="the tool to run")

    server.stop()
    got = drain_until_closed(first)
    drain_until_closed(second)
    assert first.close_code == 1001 and second.close_code == 1001
    cancelled = [m for m in got if m["type"] == "TOOL_DONE"]
    assert [m["payload"]["status"] for m in cancelled] == ["CANCELLED"]
    wait_for(lambda: state.get("killed"), what="the running tool to be killed")
    assert len(stopped.calls) == 1 and on_stopped.calls == [()]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.port}/health", timeout=timeout(2))


def test_close_all_connections_keeps_sessions(server: ProtoServer, ws) -> None:
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    server.close_all_connections()
    drain_until_closed(client)
    assert client.close_code == 1001
    snap = wait_for(lambda: (lambda s: s if s and not s["connected"] else None)(
        server.get_session(sid)), what="the session to be disconnected")
    assert snap["id"] == sid  # kept for resume
    resumed = ws(server, session=sid, last_seq="1")
    resumed.envelopes = Envelopes(start=2)  # upstream seq belongs to the session
    barrier(resumed)
    assert server.get_session(sid)["connected"] is True


# -- tools ------------------------------------------------------------------------------


def test_register_unregister_get_tools(server: ProtoServer, ws) -> None:
    names = {t.name for t in server.get_tools()}
    assert {"echo", "add"} <= names
    for t in server.get_tools():
        assert isinstance(t, Tool) and t.description and isinstance(t.input_schema, dict)

    server.register_tool(tool("double", lambda p, *a: {"value": p["n"] * 2}))
    assert "double" in {t.name for t in server.get_tools()}
    client = ws(server)
    client.hello()
    call(client, "double", {"n": 21}, "d1")
    done = client.recv_type("TOOL_DONE", call_id="d1")
    assert done["payload"]["status"] == "OK" and done["payload"]["result"] == {"value": 42}

    assert server.unregister_tool("double") is True
    assert server.unregister_tool("double") is False
    assert "double" not in {t.name for t in server.get_tools()}
    call(client, "double", {"n": 1}, "d2")
    assert client.recv_type("TOOL_DONE", call_id="d2")["payload"]["status"] == "ERROR"
    client.expect_error("TOOL_NOT_FOUND")


def test_builtin_tools(server: ProtoServer, ws) -> None:
    client = ws(server)
    client.hello()
    call(client, "echo", {"message": "hi"}, "e1")
    call(client, "add", {"a": 2, "b": 3.5}, "a1")
    echo = client.recv_type("TOOL_DONE", call_id="e1")
    add = client.recv_type("TOOL_DONE", call_id="a1")
    assert echo["channel"] == "AGENT"
    assert (echo["payload"]["status"], echo["payload"]["result"]) == ("OK", {"echoed": "hi"})
    assert (add["payload"]["status"], add["payload"]["result"]) == ("OK", {"result": 5.5})


def test_tool_decorator(server: ProtoServer, ws) -> None:
    @server.tool(input_schema={"type": "object", "required": ["text"]},
                 output_schema={"type": "object", "required": ["text"]})
    def shout(params, session_id, call_id, srv):
        """Upper-cases text."""
        return {"text": params["text"].upper(), "session": session_id, "call": call_id}

    registered = {t.name: t for t in server.get_tools()}["shout"]
    assert registered.description == "Upper-cases text."
    assert shout({"text": "x"}, "s", "c", None)["text"] == "X"  # still a plain function
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    call(client, "shout", {"text": "hey"}, "s1")
    result = client.recv_type("TOOL_DONE", call_id="s1")["payload"]["result"]
    assert result == {"text": "HEY", "session": sid, "call": "s1"}


def test_tool_progress_via_send_tool_update(server: ProtoServer, ws) -> None:
    def slow(params, session_id, call_id, srv):
        assert srv is server
        srv.send_tool_update(session_id, call_id, "RUNNING", 25)
        gevent.sleep(0.01)
        srv.send_tool_update(session_id, call_id, "RUNNING", 75)
        return {"done": True}

    server.register_tool(tool("slow", slow))
    client = ws(server)
    client.hello()
    call(client, "slow", {}, "p1")
    first = client.recv_type("TOOL_UPDATE", call_id="p1")
    second = client.recv_type("TOOL_UPDATE", call_id="p1")
    done = client.recv_type("TOOL_DONE", call_id="p1")
    assert (first["payload"]["status"], first["payload"]["progress"]) == ("RUNNING", 25)
    assert (second["payload"]["status"], second["payload"]["progress"]) == ("RUNNING", 75)
    assert done["payload"]["status"] == "OK" and done["payload"]["result"] == {"done": True}
    assert int(first["seq"]) < int(second["seq"]) < int(done["seq"])


def test_tool_without_execute_is_finished_by_a_tool_call_listener(server: ProtoServer,
                                                                  ws) -> None:
    seen: list[ToolExecution] = []

    def on_call(sender, session_id, execution):
        seen.append(execution)
        if execution.tool_name == "manual":
            sender.send_tool_done(session_id, execution.call_id, "OK",
                                  {"answer": execution.arguments["q"] * 2})

    signals.tool_call.connect(on_call, sender=server)
    server.register_tool(tool("manual"))
    client = ws(server)
    client.hello()
    call(client, "manual", {"q": 21}, "m1")
    done = client.recv_type("TOOL_DONE", call_id="m1")
    assert done["payload"]["status"] == "OK" and done["payload"]["result"] == {"answer": 42}
    execution = seen[0]
    assert (execution.call_id, execution.tool_name, execution.arguments) == \
        ("m1", "manual", {"q": 21})
    assert execution.to_dict()["callId"] == "m1"
    barrier(client)
    assert len(dones(client, "m1")) == 1


def test_tool_without_execute_finished_from_another_thread(server: ProtoServer, ws) -> None:
    calls: "queue.Queue[tuple[str, ToolExecution]]" = queue.Queue()
    server.on("toolCall", lambda session_id, execution: calls.put((session_id, execution)))
    server.register_tool(tool("manual"))
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    call(client, "manual", {}, "m2")
    session_id, execution = calls.get(timeout=timeout(5))
    assert session_id == sid and execution.call_id == "m2"
    with pytest.raises(ProtoError):
        server.send_tool_done(sid, "m2", "FINE")
    assert server.send_tool_done(sid, "m2", "ERROR", {"why": "app said no"}) is True
    assert server.send_tool_done(sid, "m2", "OK") is False  # already finished
    done = client.recv_type("TOOL_DONE", call_id="m2")
    assert done["payload"]["status"] == "ERROR" and done["payload"]["result"] == {
        "why": "app said no"}
    barrier(client)
    assert len(dones(client, "m2")) == 1


def test_tool_that_raises(server: ProtoServer, ws) -> None:
    errors = Recorder()
    signals.error.connect(errors, sender=server)

    def broken(params, *args):
        raise RuntimeError("kaboom")

    server.register_tool(tool("broken", broken))
    client = ws(server)
    client.hello()
    sent = call(client, "broken", {}, "b1")
    done = client.recv_type("TOOL_DONE", call_id="b1")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"
    error = client.expect_error("TOOL_EXECUTION_ERROR")
    assert "kaboom" in error["payload"]["message"]
    assert error["payload"]["related_id"] == sent["id"]
    raised = wait_for(lambda: [kw["error"] for kw in errors.kwargs
                               if isinstance(kw["error"], RuntimeError)],
                      what="the error signal with the tool's exception")
    assert str(raised[0]) == "kaboom"
    barrier(client)
    assert len(dones(client, "b1")) == 1
    # the session still works
    call(client, "echo", {"message": "ok"}, "b2")
    assert client.recv_type("TOOL_DONE", call_id="b2")["payload"]["status"] == "OK"


def test_result_failing_output_schema(server: ProtoServer, ws) -> None:
    server.register_tool(tool("liar", lambda p, *a: {"count": "many"}, output_schema={
        "type": "object", "required": ["count"],
        "properties": {"count": {"type": "integer"}}}))
    client = ws(server)
    client.hello()
    call(client, "liar", {}, "l1")
    done = client.recv_type("TOOL_DONE", call_id="l1")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"
    assert "result" not in done["payload"]
    error = client.expect_error("TOOL_EXECUTION_ERROR")
    assert "outputSchema" in error["payload"]["message"]
    assert error["payload"]["detail"]


def test_per_tool_timeout(server: ProtoServer, ws) -> None:
    server.register_tool(tool("sleepy", lambda p, *a: gevent.sleep(10) or {}, timeout=100))
    client = ws(server)
    client.hello()
    started = time.monotonic()
    call(client, "sleepy", {}, "t1")
    done = client.recv_type("TOOL_DONE", call_id="t1", within=3)
    assert time.monotonic() - started < timeout(3)
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"
    error = client.expect_error("TOOL_EXECUTION_ERROR")
    assert "timed out" in error["payload"]["message"]
    barrier(client)
    assert len(dones(client, "t1")) == 1


def test_server_wide_tool_timeout(make_server, ws) -> None:
    server = make_server(toolTimeout=100)
    server.register_tool(tool("sleepy", lambda p, *a: gevent.sleep(10) or {}))
    client = ws(server)
    client.hello()
    call(client, "sleepy", {}, "t2")
    done = client.recv_type("TOOL_DONE", call_id="t2", within=3)
    assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"


def test_params_failing_input_schema(server: ProtoServer, ws) -> None:
    ran: list[Any] = []
    server.register_tool(tool("strict", lambda p, *a: ran.append(p) or {}, input_schema={
        "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}))
    client = ws(server)
    client.hello()
    call(client, "add", {"a": "one", "b": 2}, "i1")
    done = client.recv_type("TOOL_DONE", call_id="i1")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "INVALID_MESSAGE"
    error = client.expect_error("INVALID_MESSAGE")
    detail = error["payload"]["detail"]
    assert isinstance(detail, list) and detail
    assert any(d.get("path") == "a" for d in detail), detail

    call(client, "strict", {"n": "x"}, "i2")
    assert client.recv_type("TOOL_DONE", call_id="i2")["payload"]["status"] == "ERROR"
    assert client.expect_error("INVALID_MESSAGE")["payload"]["detail"]
    barrier(client)
    assert ran == []  # execute never ran
    assert len(dones(client, "i1")) == 1 and len(dones(client, "i2")) == 1


def test_unknown_tool(server: ProtoServer, ws) -> None:
    client = ws(server)
    client.hello()
    call(client, "no_such_tool", {}, "u1")
    done = client.recv_type("TOOL_DONE", call_id="u1")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_NOT_FOUND"
    assert "no_such_tool" in client.expect_error("TOOL_NOT_FOUND")["payload"]["message"]


def test_tool_cancel(server: ProtoServer, ws) -> None:
    state: dict[str, bool] = {}

    def long(params, *args):
        state["running"] = True
        try:
            gevent.sleep(30)
            state["finished"] = True
        except gevent.GreenletExit:
            state["killed"] = True
            raise
        return {}

    server.register_tool(tool("long", long))
    client = ws(server)
    client.hello()
    call(client, "long", {}, "c1")
    wait_for(lambda: state.get("running"), what="the tool to start")
    client.send("TOOL_CANCEL", "USER", {"call_id": "c1"})
    done = client.recv_type("TOOL_DONE", call_id="c1")
    assert done["payload"]["status"] == "CANCELLED"
    wait_for(lambda: state.get("killed"), what="the execution to be killed")
    # cancelling again, or cancelling an unknown call, is a no-op
    client.send("TOOL_CANCEL", "USER", {"call_id": "c1"})
    client.send("TOOL_CANCEL", "USER", {"call_id": "never-existed"})
    barrier(client)
    assert len(dones(client, "c1")) == 1
    assert not [m for m in client.received if m["type"] == "ERROR"]
    assert "finished" not in state


def test_tool_list(server: ProtoServer, ws) -> None:
    server.register_tool(tool("custom"))
    client = ws(server)
    client.hello()
    client.send("TOOL_LIST", "SYSTEM", {})
    listing = client.recv_type("TOOL_LIST")
    assert listing["channel"] == "SYSTEM"
    tools = {t["name"]: t for t in listing["payload"]["tools"]}
    assert {"echo", "add", "custom"} <= set(tools)
    for t in tools.values():
        assert set(t) == {"name", "description", "inputSchema", "outputSchema"}
    assert tools["add"]["inputSchema"]["required"] == ["a", "b"]


def test_queueing_and_max_runs_exceeded(make_server, ws) -> None:
    server = make_server(maxConcurrentRuns=1, toolQueueSize=1)
    release = threading.Event()
    running: list[str] = []
    peak = [0]

    def blocking(params, session_id, call_id, srv):
        running.append(call_id)
        peak[0] = max(peak[0], len(running))
        try:
            while not release.is_set():
                gevent.sleep(0.01)
        finally:
            running.remove(call_id)
        return {"call": call_id}

    server.register_tool(tool("blocking", blocking))
    client = ws(server)
    client.hello()
    call(client, "blocking", {}, "q1")
    wait_for(lambda: running == ["q1"], what="q1 to run")
    call(client, "blocking", {}, "q2")
    queued = client.recv_type("TOOL_UPDATE", call_id="q2")
    assert queued["payload"]["status"] == "QUEUED"
    call(client, "blocking", {}, "q3")
    rejected = client.recv_type("TOOL_DONE", call_id="q3")
    assert rejected["payload"]["status"] == "ERROR"
    assert rejected["payload"]["error"]["code"] == "MAX_RUNS_EXCEEDED"
    client.expect_error("MAX_RUNS_EXCEEDED")
    assert running == ["q1"]  # q2 waits

    release.set()
    first = client.recv_type("TOOL_DONE", call_id="q1")
    second = client.recv_type("TOOL_DONE", call_id="q2")
    assert first["payload"]["result"] == {"call": "q1"}
    assert second["payload"]["result"] == {"call": "q2"}
    assert peak[0] == 1
    barrier(client)
    for cid in ("q1", "q2", "q3"):
        assert len(dones(client, cid)) == 1, cid
    assert not [m for m in client.received if m["type"] == "TOOL_UPDATE"
                and m["payload"]["call_id"] in ("q1", "q3")]


# -- sessions and messages --------------------------------------------------------------

SESSION_FIELDS = {"id", "userId", "connected", "handshakeCompleted", "lastActivity", "credits",
                  "byteCredits", "pausedChannels", "lastAck", "lastDeliveredSeq",
                  "replayWindow", "activeRuns", "pendingMessages"}


def test_get_session_live_values(server: ProtoServer, ws) -> None:
    connected: "queue.Queue[str]" = queue.Queue()
    server.on("connect", connected.put)
    client = ws(server, server.issue_token("bob"))
    sid = connected.get(timeout=timeout(5))

    snap = server.get_session(sid)
    assert SESSION_FIELDS <= set(snap)
    assert snap["id"] == sid and snap["userId"] == "bob"
    assert snap["connected"] is True and snap["handshakeCompleted"] is False
    assert snap["ws"] is not None
    assert "sseResponse" not in snap and "httpResponse" not in snap

    client.hello()
    pong = (barrier(client), client.received[-1])[1]
    snap = server.get_session(sid)
    assert snap["handshakeCompleted"] is True
    assert snap["lastDeliveredSeq"] == pong["seq"]
    assert isinstance(snap["lastActivity"], (int, float)) and snap["lastActivity"] > 0
    assert isinstance(snap["credits"], dict) and isinstance(snap["byteCredits"], dict)
    assert all(isinstance(v, (int, float)) for v in snap["credits"].values())
    assert isinstance(snap["pausedChannels"], set) and isinstance(snap["activeRuns"], set)
    assert isinstance(snap["lastAck"], str)

    run = server.start_run(sid)
    assert server.get_session(sid)["activeRuns"] == {run["runId"]}
    client.recv_type("RUN_STARTED", run_id=run["runId"])
    assert server.get_session(sid)["lastDeliveredSeq"] == client.received[-1]["seq"]

    client.close()
    wait_for(lambda: server.get_session(sid)["connected"] is False, what="connected=False")
    assert server.get_session("no-such-session") is None


def test_send_message_stamps_envelope(server: ProtoServer, ws) -> None:
    client = ws(server)
    hello = client.hello()
    sid = hello["payload"]["session"]
    before = int(time.time() * 1000)
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": "app-1", "content_type": "text/plain"}})
    msg = client.recv_type("MESSAGE_START", message_id="app-1")
    assert msg["session"] == sid
    assert isinstance(msg["id"], str) and msg["id"]
    assert msg["seq"] == str(int(hello["seq"]) + 1)
    assert msg["ts"].isdigit() and before - 1000 <= int(msg["ts"]) <= time.time() * 1000 + 1000
    assert msg["channel"] == "AGENT"

    server.send_message(sid, {"id": "my-own-id", "type": "MESSAGE_END", "channel": "AGENT",
                              "payload": {"message_id": "app-1"}})
    end = client.recv_type("MESSAGE_END")
    assert end["id"] == "my-own-id" and end["seq"] == str(int(msg["seq"]) + 1)
    with pytest.raises(ProtoError):
        server.send_message("no-such-session", {"type": "MESSAGE_END", "channel": "AGENT",
                                                "payload": {}})


def test_broadcast_reaches_every_connected_client(server: ProtoServer, ws) -> None:
    a, b = ws(server), ws(server, server.issue_token("bob"))
    sid_a = a.hello()["payload"]["session"]
    sid_b = b.hello()["payload"]["session"]
    barrier(b)  # b is one message further along than a
    reached = server.broadcast({"type": "MESSAGE_START", "channel": "AGENT",
                                "payload": {"message_id": "all", "content_type": "text/plain"}})
    assert reached == 2
    got_a = a.recv_type("MESSAGE_START", message_id="all")
    got_b = b.recv_type("MESSAGE_START", message_id="all")
    assert (got_a["session"], got_b["session"]) == (sid_a, sid_b)
    assert got_a["seq"] == "2" and got_b["seq"] == "3"
    assert got_a["id"] and got_b["id"] and got_a["ts"].isdigit() and got_b["ts"].isdigit()


# -- events -----------------------------------------------------------------------------

EVENTS = {  # spec name -> (blinker signal, kwargs in order)
    "connect": (signals.connect, ("session_id",)),
    "handshake": (signals.handshake, ("session_id", "payload")),
    "textMessage": (signals.text_message, ("session_id", "message")),
    "toolCall": (signals.tool_call, ("session_id", "execution")),
    "binary": (signals.binary, ("session_id", "data")),
    "runStarted": (signals.run_started, ("session_id", "run")),
    "error": (signals.error, ("error",)),
    "disconnect": (signals.disconnect, ("session_id",)),
}


def test_every_event_as_blinker_signal_and_via_on(server: ProtoServer, ws) -> None:
    blinker: dict[str, Recorder] = {}
    positional: dict[str, Positional] = {}
    for name, (signal, _) in EVENTS.items():
        blinker[name] = Recorder()
        signal.connect(blinker[name], sender=server)
        positional[name] = Positional()
        server.on(name, positional[name])
    elsewhere = Recorder()  # a receiver for another sender hears nothing
    signals.connect.connect(elsewhere, sender=object())

    client = ws(server)
    sid = client.hello()["payload"]["session"]
    client.send("MESSAGE_START", "USER", {"message_id": "t", "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": "t", "content": "hello "})
    client.send("MESSAGE_PART", "USER", {"message_id": "t", "content": "world"})
    client.send("MESSAGE_END", "USER", {"message_id": "t"})
    client.recv_type("MESSAGE_END")
    call(client, "echo", {"message": "x"}, "e1")
    client.recv_type("TOOL_DONE", call_id="e1")
    client.ws.send(b"\x00\x01binary")
    run = server.start_run(sid, metadata={"k": 1})
    client.send_raw("{not json")
    client.expect_error("INVALID_MESSAGE")
    wait_for(lambda: blinker["binary"].calls, what="the binary event")
    client.close()
    wait_for(lambda: blinker["disconnect"].calls, what="the disconnect event")

    for name, (_, arg_names) in EVENTS.items():
        assert blinker[name].calls, name
        for sender, kwargs in blinker[name].calls:
            assert sender is server
            assert set(arg_names) <= set(kwargs), (name, kwargs)
        assert len(positional[name].calls) == len(blinker[name].calls), name
        for args, kwargs in zip(positional[name].calls, blinker[name].kwargs, strict=True):
            assert args == tuple(kwargs[a] for a in arg_names), name
    assert elsewhere.calls == []

    assert positional["connect"].calls == [(sid,)]
    assert positional["disconnect"].calls == [(sid,)]
    (hs_sid, payload), = positional["handshake"].calls
    assert hs_sid == sid and payload["proto_version"] == "1.1.2"
    texts = positional["textMessage"].calls
    assert [m["type"] for _, m in texts] == ["MESSAGE_START", "MESSAGE_PART", "MESSAGE_PART",
                                             "MESSAGE_END"]
    assert all(s == sid for s, _ in texts)
    end = texts[-1][1]["payload"]
    assert end["text"] == "hello world" and end["content_type"] == "text/plain"
    (tc_sid, execution), = positional["toolCall"].calls
    assert tc_sid == sid and isinstance(execution, ToolExecution)
    assert (execution.call_id, execution.tool_name, execution.arguments) == \
        ("e1", "echo", {"message": "x"})
    assert positional["binary"].calls == [(sid, b"\x00\x01binary")]
    (rs_sid, run_obj), = positional["runStarted"].calls
    assert rs_sid == sid and isinstance(run_obj, Run)
    assert run_obj.run_id == run["runId"] and run_obj.metadata == {"k": 1}
    assert run["status"] == "active"
    errors = [args[0] for args in positional["error"].calls]
    assert any(isinstance(e, ProtoError) and e.code == "INVALID_MESSAGE" for e in errors)


def test_run_finished_and_cancelled_events(server: ProtoServer, ws) -> None:
    finished, cancelled = Positional(), Positional()
    server.on("runFinished", finished)
    server.on("runCancelled", cancelled)
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    one = server.start_run(sid)
    two = server.start_run(sid, run_id="r2")
    assert two["runId"] == "r2"
    done = server.finish_run(sid, one["runId"], summary="ok")
    assert done["status"] == "finished"
    assert server.cancel_run(sid, "r2")["status"] == "cancelled"
    assert [(s, r.run_id, r.status) for s, r in finished.calls] == \
        [(sid, one["runId"], "finished")]
    assert [(s, r.run_id, r.status) for s, r in cancelled.calls] == [(sid, "r2", "cancelled")]
    client.recv_type("RUN_FINISHED", run_id="r2", status="cancelled")


def test_unknown_event_name_is_refused(server: ProtoServer) -> None:
    with pytest.raises(ValueError, match="unknown event"):
        server.on("text_message", lambda *a: None)


def test_a_raising_listener_does_not_break_the_server(server: ProtoServer, ws) -> None:
    errors = Recorder()
    signals.error.connect(errors, sender=server)

    def bad_blinker(sender, **kwargs):
        raise RuntimeError("blinker listener boom")

    def bad_positional(*args):
        raise ValueError("on() listener boom")

    signals.text_message.connect(bad_blinker, sender=server)
    server.on("textMessage", bad_positional)
    server.on("handshake", bad_positional)
    server.on("connect", bad_positional)

    client = ws(server)
    client.hello()  # the handshake still completes
    client.send("MESSAGE_START", "USER", {"message_id": "t", "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": "t", "content": "still echoed"})
    client.send("MESSAGE_END", "USER", {"message_id": "t"})
    part = client.recv_type("MESSAGE_PART")
    assert part["payload"]["content"] == "still echoed"
    client.recv_type("MESSAGE_END")
    barrier(client)
    raised = [kw["error"] for kw in errors.kwargs]
    assert any(isinstance(e, RuntimeError) and "blinker listener boom" in str(e)
               for e in raised)
    assert sum(isinstance(e, ValueError) and "on() listener boom" in str(e)
               for e in raised) >= 5  # connect, handshake, three text messages
    assert not [m for m in client.received if m["type"] == "ERROR"]  # not the client's fault


# -- Flask integration and tokens ---------------------------------------------------------


def test_init_app_on_an_existing_flask_app(own_servers, ws) -> None:
    app = Flask("embedding_app")

    @app.get("/hello")
    def hello():
        return {"hello": "world"}

    server = own_servers()
    server.init_app(app)
    assert app.extensions["protoflask"] is server
    assert server.app is app
    with pytest.raises(RuntimeError):
        ProtoServer(BASE).init_app(app)  # one ProtoServer per app
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    assert requests.get(base + "/hello", timeout=timeout(5)).json() == {"hello": "world"}
    assert requests.get(base + "/health", timeout=timeout(5)).json()["status"] == "ok"
    assert "totalMessages" in requests.get(base + "/stats", timeout=timeout(5)).json()
    assert requests.get(base + "/nope", timeout=timeout(5)).status_code == 404
    client = ws(server)
    client.hello()
    barrier(client)


def test_app_in_the_constructor(make_server, ws) -> None:
    app = Flask("another_app")
    app.add_url_rule("/mine", "mine", lambda: "mine")
    server = make_server(app=app)
    assert server.app is app and app.extensions["protoflask"] is server
    assert requests.get(server.base_url + "/mine", timeout=timeout(5)).text == "mine"
    ws(server).hello()


def test_issue_token(server: ProtoServer, ws) -> None:
    token = server.issue_token("zoe")
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "zoe" and claims["exp"] - claims["iat"] == 86400
    short = server.issue_token("zoe", "30s")
    assert jwt.decode(short, SECRET, algorithms=["HS256"])["exp"] - \
        jwt.decode(short, SECRET, algorithms=["HS256"])["iat"] == 30
    client = ws(server, short)
    sid = client.hello()["payload"]["session"]
    assert server.get_session(sid)["userId"] == "zoe"


def test_issue_token_honours_jwt_expires_in(make_server) -> None:
    server = make_server(jwtExpiresIn="15m")
    claims = jwt.decode(server.issue_token("x"), SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 900


def test_get_stats(server: ProtoServer, ws) -> None:
    client = ws(server)
    client.hello()
    barrier(client)
    stats = wait_for(lambda: (lambda s: s if s["totalMessages"] == 2 else None)(
        server.get_stats()), what="two upstream messages counted")
    assert stats["activeConnections"] == 1 and stats["totalConnections"] == 1
    assert stats["errorRate"] == 0
