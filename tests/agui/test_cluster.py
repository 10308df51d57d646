"""/proto/agui on two nodes of one Redis cluster: a thread's runs on either node (its
session moves to the node the run is posted to, its seqs go on), a finished run
re-attached on the other node, and a run stopped through the node that does not hold
it."""

from __future__ import annotations

from typing import Any

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
