"""protoflask.client against a real server on every transport: handshake, text, tools,
runs, typed errors, credits, heartbeats, and plain threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from protoflask.client import (
    Client, ClientTimeout, ConnectionFailed, ConnectionLost, ConnectionRefused, ServerError,
    ToolCancelled, ToolError, connect,
)

from ..support import free_listener, timeout, wait_for
from .conftest import add_tools


def agent_text(server, sid: str, mid: str, parts: list[str]) -> None:
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": mid, "content_type": "text/plain"}})
    for part in parts:
        server.send_message(sid, {"type": "MESSAGE_PART", "channel": "AGENT",
                                  "payload": {"message_id": mid, "content": part}})
    server.send_message(sid, {"type": "MESSAGE_END", "channel": "AGENT",
                              "payload": {"message_id": mid}})


def test_handshake(server, connect_client):
    client = connect_client(server)
    assert client.session_id and client.connected
    caps = client.server_hello["capabilities"]
    assert caps["flow_control"]["initial_credit_messages"] == 1000
    assert client.server_hello["last_client_seq"] == "0"
    snap = server.get_session(client.session_id)
    assert snap["connected"] and snap["handshakeCompleted"] and snap["userId"] == "alice"


def test_text_round_trip_and_streamed_parts(server, connect_client):
    parts: list[tuple[str, str]] = []
    client = connect_client(server, on_text_part=lambda mid, c: parts.append((mid, c)))
    client.send_text("hello")
    reply = client.next_text(timeout(5))
    assert (reply.text, reply.channel, reply.content_type) == ("hello", "AGENT", "text/plain")
    client.send_text(iter(["str", "eam", "ed"]))
    assert client.next_text(timeout(5)).text == "streamed"
    agent_text(server, client.session_id, "a1", ["one ", "two ", "three"])
    text = client.next_text(timeout(5))
    assert (text.message_id, text.text) == ("a1", "one two three")
    assert [c for mid, c in parts if mid == "a1"] == ["one ", "two ", "three"]


def test_tool_call_with_progress(server, connect_client):
    add_tools(server)
    client = connect_client(server)
    progress: list[Any] = []
    result = client.call_tool("slow", {"steps": 4},
                              on_progress=lambda p, status, partial: progress.append((p, status)),
                              timeout=timeout(5))
    assert result == {"steps": 4}
    assert progress == [(25, "RUNNING"), (50, "RUNNING"), (75, "RUNNING"), (100, "RUNNING")]
    assert client.call_tool("add", {"a": 2, "b": 40}) == {"result": 42}
    tools = {t["name"]: t for t in client.list_tools()}
    assert {"echo", "add", "slow", "broken"} <= set(tools)
    assert tools["slow"]["inputSchema"]["required"] == ["steps"]


def test_tool_errors_carry_contract_codes(server, connect_client):
    add_tools(server)
    client = connect_client(server)
    with pytest.raises(ToolError) as unknown:
        client.call_tool("nope", {})
    assert unknown.value.code == "TOOL_NOT_FOUND"
    with pytest.raises(ToolError) as bad_params:
        client.call_tool("add", {"a": "x"})
    assert bad_params.value.code == "INVALID_MESSAGE"
    with pytest.raises(ToolError) as broken:
        client.call_tool("broken", {})
    assert broken.value.code == "TOOL_EXECUTION_ERROR"
    call = client.call_tool_async("slow", {"steps": 500})
    wait_for(lambda: call.updates, what="the slow tool to report progress")
    call.cancel()
    with pytest.raises(ToolCancelled):
        call.result(timeout(5))
    assert client.call_tool("echo", {"message": "still fine"}) == {"echoed": "still fine"}


def test_runs(make_server, connect_client):
    server = make_server(maxConcurrentRuns=1)
    add_tools(server)
    client = connect_client(server)
    run_id = client.start_run(thread_id="t1")
    assert client.call_tool("add", {"a": 1, "b": 1}, run_id=run_id) == {"result": 2}
    with pytest.raises(ServerError) as too_many:
        client.start_run()
    assert too_many.value.code == "MAX_RUNS_EXCEEDED"
    assert client.finish_run(run_id, summary="done") == {
        "run_id": run_id, "status": "finished", "summary": "done"}
    with pytest.raises(ServerError) as gone:
        client.finish_run(run_id)
    assert gone.value.code == "RUN_NOT_FOUND"
    second = client.start_run()
    call = client.call_tool_async("slow", {"steps": 500}, run_id=second)
    wait_for(lambda: call.updates, what="the run's tool to start")
    assert client.cancel_run(second)["status"] == "cancelled"
    with pytest.raises(ToolCancelled):
        call.result(timeout(5))


def test_refused_connections_are_typed(server, transport):
    url = server.base_url
    with pytest.raises(ConnectionRefused) as bad:
        connect(url, "not-a-jwt", transport=transport, timeout=timeout(5))
    assert (bad.value.status, bad.value.code) == (401, "INVALID_TOKEN")
    with pytest.raises(ConnectionRefused) as missing:
        connect(url, None, transport=transport, timeout=timeout(5))
    assert (missing.value.status, missing.value.code) == (401, "MISSING_TOKEN")
    listener = free_listener()  # a port nobody answers on once closed
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(ConnectionFailed) as unreachable:
        connect(f"http://127.0.0.1:{port}", "t", transport=transport, timeout=timeout(5))
    assert unreachable.value.code == "UNREACHABLE"


def test_max_connections_is_a_503_refusal(make_server, connect_client, transport):
    server = make_server(maxConnections=1)
    connect_client(server)
    with pytest.raises(ConnectionRefused) as full:
        connect(server.base_url, server.issue_token("bob"), transport=transport,
                timeout=timeout(5))
    assert (full.value.status, full.value.code) == (503, "MAX_CONNECTIONS")


def test_small_credits_both_ways_do_not_stall(make_server, connect_client):
    """5 upstream message credits per channel (topped up at 2), 4 downstream: 150 texts
    up and 600 messages down complete without an INSUFFICIENT_CREDITS or a stall."""
    server = make_server(flowControl={"initialCreditMessages": 5, "creditThreshold": 2,
                                      "initialCredits": 5, "adaptiveAdjustment": False,
                                      "minCredits": 1})
    errors: list[dict[str, Any]] = []
    client = connect_client(server, credit_messages=4,
                            on_message=lambda m: errors.append(m) if m["type"] == "ERROR"
                            else None)
    for n in range(150):
        client.send_text(f"up {n}")
    assert [client.next_text(timeout(10)).text for _ in range(150)] == \
        [f"up {n}" for n in range(150)]
    for n in range(200):
        agent_text(server, client.session_id, f"d{n}", [f"down {n}"])
    assert [client.next_text(timeout(10)).text for _ in range(200)] == \
        [f"down {n}" for n in range(200)]
    assert errors == []


def test_heartbeats_are_answered(make_server, connect_client):
    server = make_server(heartbeatInterval=50, heartbeatTimeout=200)
    pings: list[dict[str, Any]] = []
    client = connect_client(server, on_message=lambda m: pings.append(m)
                            if m["type"] == "PING" else None)
    wait_for(lambda: len(pings) >= 8, within=10, what="eight heartbeat PINGs")
    # eight intervals, each far longer than the timeout would allow without PONGs
    assert client.reconnects == 0 and client.connected
    assert server.get_session(client.session_id)["connected"]
    assert client.call_tool("add", {"a": 1, "b": 2}) == {"result": 3}


def test_acks_trim_the_servers_replay_window(server, connect_client):
    client = connect_client(server)
    for n in range(20):
        client.send_text(f"t{n}")
    for _ in range(20):
        client.next_text(timeout(5))
    wait_for(lambda: server.get_session(client.session_id)["lastAck"] == str(client.last_seq),
             what="the client's ACK of everything it received")


def test_closed_client_raises_connection_lost(server, connect_client):
    client = connect_client(server)
    client.close()
    with pytest.raises(ConnectionLost) as closed:
        client.send_text("late")
    assert closed.value.code == "CLOSED"
    with pytest.raises(ConnectionLost):
        client.next_text(timeout(1))


def test_next_text_times_out(server, connect_client):
    client = connect_client(server)
    with pytest.raises(ClientTimeout) as slow:
        client.next_text(0.05)
    assert slow.value.code == "TIMEOUT" and isinstance(slow.value, TimeoutError)


def test_one_client_from_many_plain_threads(server, connect_client):
    client = connect_client(server)
    results: dict[int, list[Any]] = {}

    def worker(n: int) -> None:
        results[n] = [client.call_tool("add", {"a": n, "b": i}) for i in range(20)]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout(20))
    assert results == {n: [{"result": n + i} for i in range(20)] for n in range(4)}


def test_unknown_transport_is_a_value_error():
    with pytest.raises(ValueError, match="unknown transport"):
        Client("http://127.0.0.1:1", "t", transport="carrier-pigeon")


def test_back_pressure_pause_and_resend(make_server, connect_client):
    """A tiny outbound buffer and little downstream credit make the server pause USER;
    texts it refused with CHANNEL_PAUSED are sent again after RESUME_CHANNEL, once each
    and in order, and the pause does not feed on itself: the server pauses at most once
    per burst of data it queued (the 40 texts pushed first, then each echoed text), and
    what the client sends stays bounded (a livelock once sent 400,000 PAUSE/RESUME pairs
    and 25,000 client messages for these 30 texts)."""
    server = make_server(outboundBufferSize=1024)
    got_up: list[str] = []
    server.on("textMessage", lambda sid, m: got_up.append(m["payload"]["text"])
              if m["type"] == "MESSAGE_END" else None)
    seen: list[str] = []
    client = connect_client(server, credit_messages=2,
                            on_message=lambda m: seen.append(m["type"]))
    for n in range(40):
        agent_text(server, client.session_id, f"d{n}", ["x" * 100])
    sent = [f"up {n}" for n in range(30)]
    for text in sent:
        client.send_text(text)
    texts = [client.next_text(timeout(10)).text for _ in range(70)]
    assert [t for t in texts if t.startswith("x")] == ["x" * 100] * 40
    assert [t for t in texts if t.startswith("up")] == sent
    wait_for(lambda: got_up == sent, what="every text at the server once, in order")
    pauses, resumes = seen.count("PAUSE_CHANNEL"), seen.count("RESUME_CHANNEL")
    assert 1 <= pauses <= 1 + len(sent) and pauses - 1 <= resumes <= pauses
    # After a refusal the client resends in a window (8 messages, doubled only once a
    # PONG proved the server processed it), so a pause refuses a few messages, not the
    # whole queue (630 ERRORs and ~960 client messages for these 90 before). Besides the
    # resends, the client sends one FLOW_UPDATE per AGENT message (credit 2), an ACK
    # per 32 and a PING per window.
    errors = seen.count("ERROR")
    assert errors <= 2 * 3 * len(sent)
    assert client._seq <= 3 * len(sent) + errors + 3 * 70 + 70 // 32 + 2 * (pauses + 10)


@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_a_session_taken_over_elsewhere_is_lost_not_stolen_back(server, transport):
    """Another connection resuming our session closes ours with 4002; the client stops
    (ConnectionLost SUPERSEDED) rather than resuming and stealing it back."""
    from ..support import WSClient

    token = server.issue_token("alice")
    client = connect(server.base_url, token, transport=transport, timeout=timeout(5))
    try:
        other = WSClient(server.base_url, token, session=client.session_id,
                         last_seq=client.last_seq)
        try:
            with pytest.raises(ConnectionLost) as lost:
                client.next_text(timeout(5))
            assert lost.value.code == "SUPERSEDED"
            assert client.reconnects == 0
            assert server.get_session(client.session_id)["connected"]
        finally:
            other.close()
    finally:
        client.close()


def test_importing_the_client_loads_no_flask_or_gevent():
    import json
    import subprocess
    import sys

    from ..support import ROOT

    probe = ("import sys, json; import protoflask.client; "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout(60))
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert not loaded & {"flask", "werkzeug", "gevent", "gunicorn", "jwt", "blinker"}
