"""examples/cluster: the example app under gunicorn with two workers, twice (two nodes),
on the real Redis: notify and announce from any node, tools run where the session is."""

from __future__ import annotations

from typing import Iterator

import pytest
import requests

from protoflask.auth import TokenAuthority

from ..support import ROOT, SECRET, GunicornServer, WSClient, timeout, wait_for


@pytest.fixture
def nodes(redis_url: str, prefix: str) -> Iterator[tuple[GunicornServer, GunicornServer]]:
    env = {"REDIS_URL": redis_url, "REDIS_PREFIX": prefix, "WEB_CONCURRENCY": "2"}
    first = GunicornServer(env, app="app:app", chdir=ROOT / "examples" / "cluster")
    second = None
    try:
        second = GunicornServer(env, app="app:app", chdir=ROOT / "examples" / "cluster")
        wait_for(lambda: len(requests.get(second.base_url + "/stats", timeout=timeout(5))
                             .json()["nodes"]) == 4, within=10, what="four workers in the cluster")
        yield first, second
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_notify_and_announce_reach_sessions_on_every_worker_of_every_node(nodes) -> None:
    first, second = nodes
    issue = TokenAuthority(SECRET, ("HS256",), "1h").issue
    clients = [WSClient(node.base_url, issue(f"user{i}"))
               for i, node in enumerate([first, second, first, second])]
    operator = {"Authorization": f"Bearer {issue('operator')}"}
    try:
        for c in clients:
            c.hello()
        # only an operator may notify or announce
        for path in (f"/notify/{clients[0].session_id}", "/announce"):
            anyone = requests.post(first.base_url + path, json={"text": "x"}, timeout=timeout(10))
            assert (anyone.status_code, anyone.json()["error"]["code"]) == (401, "MISSING_TOKEN")
            user = requests.post(first.base_url + path, json={"text": "x"}, timeout=timeout(10),
                                 headers={"Authorization": f"Bearer {issue('user0')}"})
            assert (user.status_code, user.json()["error"]["code"]) == (403, "FORBIDDEN")
        for i, c in enumerate(clients):  # through the other node each time
            other = second if c.ws.remote_address[1] == first.port else first
            resp = requests.post(f"{other.base_url}/notify/{c.session_id}", headers=operator,
                                 json={"text": f"hi {i}"}, timeout=timeout(10))
            assert resp.status_code == 200, resp.text
            assert c.recv_type("NOTIFICATION")["payload"]["text"] == f"hi {i}"
        resp = requests.post(f"{first.base_url}/announce", json={"text": "all hands"},
                             headers=operator, timeout=timeout(10))
        assert resp.status_code == 200
        for c in clients:
            assert c.recv_type("ANNOUNCEMENT")["payload"]["text"] == "all hands"
        clients[0].send("TOOL_CALL", payload={"call_id": "w", "tool": "where", "params": {}})
        assert "pid" in clients[0].recv_type("TOOL_DONE")["payload"]["result"]
        missing = requests.post(f"{first.base_url}/notify/nope", json={}, headers=operator,
                                timeout=timeout(10))
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "SESSION_NOT_FOUND"
    finally:
        for c in clients:
            c.close()
