"""/proto/agui on two nodes of one Redis cluster: a thread's runs on either node (its
session moves to the node the run is posted to, its seqs go on), a finished run
re-attached on the other node, and a run stopped through the node that does not hold
it."""

from __future__ import annotations

import json
import threading
from typing import Any

import gevent
import requests

from ..interop.conftest import QUIET
from .conftest import agent_handler, weather_tool
from .test_endpoint import blocks, reattach, run_raw


def node(make_server: Any, redis_url: str, prefix: str) -> Any:
    server = make_server(redisUrl=redis_url, redisPrefix=prefix, **QUIET)
    weather_tool(server)
    server.agui_handler(agent_handler(server))
    return server


def test_a_thread_runs_on_either_node_and_reattaches_on_the_other(make_server, redis_url,
                                                                   prefix):
    a, b = node(make_server, redis_url, prefix), node(make_server, redis_url, prefix)
    token = a.issue_token("u")
    first = blocks(run_raw(a, token, "ct", "r1", "hello").content)
    second = blocks(run_raw(b, token, "ct", "r2", "tool").content)
    assert [e["type"] for _, e in first][-1] == "RUN_FINISHED"
    assert first[2][1]["delta"] == "echo: hello"
    assert second[-1][1] == {"type": "RUN_FINISHED", "threadId": "ct", "runId": "r2",
                             "result": {"temp": 21}}
    assert second[0][0] > first[-1][0]  # one session: its seqs go on across the nodes
    again = blocks(reattach(a, token, "ct", "r2").content)
    assert again == second


def test_stop_through_the_node_that_does_not_hold_the_thread(make_server, redis_url, prefix):
    a, b = node(make_server, redis_url, prefix), node(make_server, redis_url, prefix)
    token = a.issue_token("u")
    with requests.post(f"{a.base_url}/proto/agui", stream=True, timeout=20,
                       json={"threadId": "cs", "runId": "r1", "messages": [
                           {"id": "m", "role": "user", "content": "slow"}]},
                       headers={"Authorization": f"Bearer {token}"}) as stream:
        lines = stream.iter_lines()
        while b"TEXT_MESSAGE_CONTENT" not in next(lines):
            pass
        r = requests.post(f"{b.base_url}/proto/agui/stop", json={"threadId": "cs",
                                                                 "runId": "r1"},
                          headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200, r.text
        rest = b"\n".join(lines)
    assert rest.rstrip().endswith(b'"outcome":{"type":"cancelled"}}')


def test_a_stream_cut_mid_run_reattached_on_the_other_node(make_server, redis_url, prefix):
    """The run's handler goes on on node a while its session moves to node b (the
    re-attach): what it streams reaches b through the cluster, and the client ends with
    exactly the events of an uncut run."""
    a, b = node(make_server, redis_url, prefix), node(make_server, redis_url, prefix)
    token = a.issue_token("u")
    uncut = blocks(run_raw(a, token, "uncut", "r1", "long").content)
    with requests.post(f"{a.base_url}/proto/agui", stream=True, timeout=20,
                       json={"threadId": "moved", "runId": "r1", "messages": [
                           {"id": "m", "role": "user", "content": "long"}]},
                       headers={"Authorization": f"Bearer {token}"}) as stream:
        buffer = b""
        for chunk in stream.iter_content(None):
            buffer += chunk
            if buffer.count(b"\n\n") >= 5:
                break
    before = blocks(b"".join(block + b"\n\n" for block in buffer.split(b"\n\n")[:5]))
    after = blocks(reattach(b, token, "moved", "r1", before[-1][0]).content)
    prelude = [e for i, e in after if i is None]
    assert [e["type"] for e in prelude] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
    events = [e for _, e in before] + [e for i, e in after if i is not None]

    def shape(evs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        return [(e["type"], e.get("delta"), e.get("result")) for e in evs]
    assert shape(events) == shape([e for _, e in uncut])
    ids = [i for i, _ in before] + [i for i, _ in after if i is not None]
    assert ids == sorted(set(ids))


def test_a_server_tool_call_after_the_session_moved(make_server, redis_url, prefix):
    """The handler on node a calls a server tool after its thread's session moved to node
    b (a re-attach there): the call opens on b and runs on a, its progress and result
    reach the client on b, and the handler gets the result (it used to fail with
    SESSION_NOT_FOUND)."""
    moved = threading.Event()
    servers = []
    for _ in range(2):
        server = make_server(redisUrl=redis_url, redisPrefix=prefix, **QUIET)
        weather_tool(server)

        @server.agui_handler
        def handle(run: Any) -> Any:
            run.stream_text(["before"], max_delay_ms=0)
            while not moved.is_set():  # until the client re-attached on the other node
                gevent.sleep(0.02)
            result = run.call_tool("weather", {"city": "Paris"})
            run.stream_text([f"after {result['temp']}"], max_delay_ms=0)
            return {"temp": result["temp"]}
        servers.append(server)
    a, b = servers
    token = a.issue_token("u")
    with requests.post(f"{a.base_url}/proto/agui", stream=True, timeout=20,
                       json={"threadId": "tool-moved", "runId": "r1", "messages": []},
                       headers={"Authorization": f"Bearer {token}"}) as stream:
        buffer = b""
        for chunk in stream.iter_content(None):
            buffer += chunk
            if b"TEXT_MESSAGE_END" in buffer:
                break
    before = blocks(buffer[:buffer.rindex(b"\n\n") + 2])
    with requests.get(f"{b.base_url}/proto/agui", params={"thread": "tool-moved", "run": "r1"},
                      headers={"Authorization": f"Bearer {token}",
                               "Last-Event-ID": str(before[-1][0])},
                      stream=True, timeout=20) as after:
        assert after.status_code == 200  # the session is b's now
        moved.set()
        rest = blocks(after.content)
    events = [e for _, e in before] + [e for i, e in rest if i is not None]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "RUN_FINISHED" and events[-1]["result"] == {"temp": 21}
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert json.loads(result["content"]) == {"temp": 21}
    assert "CUSTOM" in kinds  # the tool's progress, from node a through the cluster
    deltas = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert deltas == ["before", "after 21"]


def test_ag_ui_events_on_a_socket_resumed_on_the_other_node(make_server, redis_url, prefix):
    """The WebSocket extension in a cluster: a socket that asked for AG-UI events is cut
    mid-run on node a and resumed on node b, which rebuilds the session's translation
    from its replay window: the client ends with exactly the events of an uncut run."""
    from .test_socket import agui_hello, run_events, shape, socket_client, start

    a, b = node(make_server, redis_url, prefix), node(make_server, redis_url, prefix)
    with socket_client(a, "uncut") as client:
        agui_hello(client)
        start(client, "r-uncut", "long")
        uncut = run_events(client)
    client = socket_client(a, "cut")
    agui_hello(client)
    start(client, "r-cut", "long")
    got = [client.recv_until(lambda m: m["type"] == "AGUI_EVENT") for _ in range(5)]
    session, last_seq = client.session_id, max(int(e["seq"]) for e in got)
    client.drop()
    with socket_client(b, "cut", session=session, last_seq=last_seq) as resumed:
        got += run_events(resumed)
    assert shape(got) == shape(uncut)
    seqs = [int(e["seq"]) for e in got if "seq" in e]
    assert seqs == sorted(set(seqs))
