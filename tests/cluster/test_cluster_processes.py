"""The cluster as it is deployed: gunicorn with two workers on one port, and two
independent server processes on two ports, all on one Redis; one of them SIGKILLed."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import requests

from protoflask.auth import TokenAuthority

from .notes import note
from .retry import when_served
from ..support import SECRET, GunicornServer, SSEClient, WSClient, timeout, wait_for

APP = "tests.fixtures.cluster_app:app"


def token(user: str) -> str:
    return TokenAuthority(SECRET, ("HS256",), "1h").issue(user)



def notes(client: Any, count: int) -> list[int]:
    return [client.recv_type("NOTE")["payload"]["n"] for _ in range(count)]


def send(base_url: str, session_id: str, message: dict[str, Any]) -> requests.Response:
    return requests.post(f"{base_url}/test/send", json={"session": session_id,
                                                        "message": message},
                         timeout=timeout(10))


def stats(base_url: str) -> dict[str, Any]:
    return requests.get(base_url + "/stats", timeout=timeout(5)).json()


@pytest.fixture
def cluster_env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "REDIS_PREFIX": prefix, "HEARTBEAT_INTERVAL": "1000"}


@pytest.fixture
def two_workers(cluster_env: dict[str, str]) -> Iterator[GunicornServer]:
    server = GunicornServer({**cluster_env, "WEB_CONCURRENCY": "2"}, app=APP)
    try:
        wait_for(lambda: len(stats(server.base_url).get("nodes", [])) == 2, within=10,
                 what="both workers in the cluster")
        yield server
    finally:
        server.stop()


def test_two_workers_on_one_port_share_every_session(two_workers: GunicornServer) -> None:
    base = two_workers.base_url
    clients = [WSClient(base, token(f"user{i}")) for i in range(6)]
    sse = SSEClient(base, token("sse-user"))
    try:
        for c in clients:
            c.hello()
        sse.hello()
        pids = set()
        for n in range(4):  # each request lands on whichever worker accepts it
            for c in clients:
                resp = send(base, c.session_id, note(n))
                assert resp.status_code == 200, resp.text
                pids.add(resp.json()["pid"])
        for c in clients:
            assert notes(c, 4) == [0, 1, 2, 3]
        for i in range(8):  # SSE POSTs land on either worker too; every one is processed
            sse.send("PING", "SYSTEM", {"nonce": f"p{i}"})
            sse.recv_type("PONG", nonce=f"p{i}")
        resp = requests.post(base + "/test/broadcast", json=note(99), timeout=timeout(10))
        assert resp.status_code == 200
        for c in [*clients, sse]:
            send(base, c.session_id, {"type": "MARK", "channel": "AGENT", "payload": {}})
        for c in [*clients, sse]:
            c.recv_type("MARK")
            assert [m["payload"]["n"] for m in c.received
                    if m["type"] == "NOTE" and m["payload"]["n"] == 99] == [99]
        # other nodes' figures are as of their last beat (at most a second old)
        cluster = wait_for(lambda: (s := stats(base))["activeConnections"] == 7 and s,
                           what="every connection counted")
        assert sum(n["activeConnections"] for n in cluster["nodes"]) == 7
        print(f"requests answered by worker pids {sorted(pids)}")
    finally:
        for c in clients:
            c.close()
        sse.close()


def test_a_client_resumes_on_another_node_after_its_node_is_killed(
        cluster_env: dict[str, str]) -> None:
    a = GunicornServer(cluster_env, app=APP)
    b = GunicornServer(cluster_env, app=APP)
    client = ghost = None
    try:
        wait_for(lambda: len(stats(b.base_url).get("nodes", [])) == 2, within=10,
                 what="both nodes in the cluster")
        client = WSClient(a.base_url, token("alice"))
        client.hello()
        ghost = WSClient(a.base_url, token("bob"))
        ghost.hello()
        for n in range(5):  # sent from the other node
            assert send(b.base_url, client.session_id, note(n)).status_code == 200
        assert notes(client, 5) == [0, 1, 2, 3, 4]
        seen = int(client.received[-1]["seq"])
        for n in range(5, 8):  # the last ones the client may or may not have read
            assert send(b.base_url, client.session_id, note(n)).status_code == 200

        a.kill()

        for n in range(8, 11):  # while no node holds the session
            assert send(b.base_url, client.session_id, note(n)).status_code == 200
        # 503 until the dead holder's beat is missed (it might be alive, not listening)
        resumed = when_served(lambda: WSClient(b.base_url, token("alice"),
                                               session=client.session_id, last_seq=seen))
        try:
            assert notes(resumed, 6) == [5, 6, 7, 8, 9, 10]
            seqs = [int(m["seq"]) for m in resumed.received]
            assert seqs == list(range(seen + 1, seen + 1 + len(seqs))), seqs
            resumed.envelopes = client.envelopes
            resumed.send("PING", "SYSTEM", {"nonce": "alive"})
            resumed.recv_type("PONG", nonce="alive")
        finally:
            resumed.close()

        # no ghosts: the dead node leaves the counts, its other session reads disconnected
        # (the resumed client's close is counted once the server has read it)
        wait_for(lambda: (s := stats(b.base_url)) and len(s["nodes"]) == 1
                 and s["activeConnections"] == 0, within=10,
                 what="the dead node to drop out, and no connection left")
        view = requests.get(f"{b.base_url}/test/session/{ghost.session_id}",
                            timeout=timeout(5)).json()
        assert view["connected"] is False and view["node"] is None
    finally:
        for c in (client, ghost):
            if c is not None:
                c.drop()
        a.stop()
        b.stop()


@pytest.mark.parametrize("resume", ["at-once", "after-the-node-dropped-out"])
def test_a_call_running_on_a_killed_node_ends_once_and_frees_its_call_id(
        cluster_env: dict[str, str], resume: str) -> None:
    """The holder dies (SIGKILL, worker and master) mid-call: the session resumed on the
    other node gets exactly one TOOL_DONE for it, ERROR / TOOL_EXECUTION_ERROR saying the
    node was lost, and the call_id can be used again. Resumed at once, the dead node
    still looks alive (its key lives 3 s): the call is watched and ended when the key
    goes; resumed later, it is ended as the session is taken over."""
    import os
    import signal
    import time

    a = GunicornServer(cluster_env, app=APP)
    b = GunicornServer(cluster_env, app=APP)
    client = None
    try:
        wait_for(lambda: len(stats(b.base_url).get("nodes", [])) == 2, within=10,
                 what="both nodes in the cluster")
        worker = requests.get(a.base_url + "/test/pid", timeout=timeout(5)).json()["pid"]
        client = WSClient(a.base_url, token("alice"))
        client.hello()
        client.send("TOOL_CALL", payload={"call_id": "c1", "tool": "slow", "params": {}})
        seen = int(client.recv_type("TOOL_UPDATE", call_id="c1")["seq"])

        os.kill(worker, signal.SIGKILL)  # the node dies: nothing of it runs on
        a.kill()
        killed = time.monotonic()
        if resume != "at-once":
            wait_for(lambda: len(stats(b.base_url).get("nodes", [])) == 1, within=10,
                     what="the dead node to drop out")

        # 503 until the dead holder's beat is missed (it might be alive, not listening)
        resumed = when_served(lambda: WSClient(b.base_url, token("alice"),
                                               session=client.session_id, last_seq=seen))
        try:
            resumed.envelopes = client.envelopes
            done = resumed.recv_type("TOOL_DONE", within=15, call_id="c1")
            assert done["payload"]["status"] == "ERROR"
            assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"
            assert "lost" in done["payload"]["error"]["message"]
            print(f"TOOL_DONE ERROR {time.monotonic() - killed:.2f}s after the kill")
            resumed.send("TOOL_CALL", payload={"call_id": "c1", "tool": "add",
                                               "params": {"a": 2, "b": 40}})
            again = resumed.recv_type("TOOL_DONE", call_id="c1")
            assert again["payload"]["status"] == "OK", again
            resumed.send("PING", "SYSTEM", {"nonce": "end"})
            resumed.recv_type("PONG", nonce="end")
            assert [m["payload"]["status"] for m in resumed.received
                    if m["type"] == "TOOL_DONE"] == ["ERROR", "OK"]
        finally:
            resumed.close()
    finally:
        if client is not None:
            client.drop()
        a.stop()
        b.stop()


def test_script_flush_under_gunicorn_is_survived(private_redis: Any) -> None:
    """SCRIPT FLUSH under two gunicorn nodes: every PING after it is answered, nothing is
    dropped, new connections work and /health stays ok (before: no PONG, every client
    dropped, new connections refused, /health ok all along)."""
    import redis

    env = {"REDIS_URL": private_redis.url, "HEARTBEAT_INTERVAL": "1000"}
    a = GunicornServer(env, app=APP)
    b = GunicornServer(env, app=APP)
    clients: list[WSClient] = []
    try:
        wait_for(lambda: len(stats(b.base_url).get("nodes", [])) == 2, within=10,
                 what="both nodes in the cluster")
        clients = [WSClient(node.base_url, token(f"user-{i}"))
                   for i, node in enumerate((a, b))]
        for c in clients:
            c.hello()
        redis.Redis.from_url(private_redis.url).script_flush()
        for n in range(5):
            for c, other in zip(clients, (b, a), strict=True):
                assert send(other.base_url, c.session_id, note(n)).status_code == 200
        for c in clients:
            assert notes(c, 5) == [0, 1, 2, 3, 4]
            c.send("PING", "SYSTEM", {"nonce": "after"})
            c.recv_type("PONG", nonce="after")
            seqs = [int(m["seq"]) for m in c.received]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        for node in (a, b):
            with WSClient(node.base_url, token("newcomer")) as fresh:
                fresh.hello()
            assert requests.get(node.base_url + "/health",
                                timeout=timeout(5)).json()["status"] == "ok"
    finally:
        for c in clients:
            c.close()
        a.stop()
        b.stop()
