"""Several nodes on one Redis: embedded servers in this process, each its own node with
its own port, hub thread and Redis connections (the process-level tests, with gunicorn
workers and SIGKILL, are in test_cluster_processes.py)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import requests

from protoflask import ProtoServer
from protoflask.core.errors import SessionNotFound

from .notes import note
from ..support import SSEClient, StreamClient, WSClient, hanging_tool, timeout, wait_for



def notes(client, count: int, within: float = 5.0) -> list[int]:
    got: list[int] = []
    while len(got) < count:
        msg = client.recv_until(lambda m: m["type"] == "NOTE", within)
        got.append(msg["payload"]["n"])
    return got


def test_a_message_sent_on_one_node_reaches_a_client_on_another(
        make_node: Callable[..., ProtoServer], make_client: Callable[..., Any]) -> None:
    a, b = make_node(), make_node()
    client = make_client(a, a.issue_token("alice"))
    client.hello()
    for n in range(5):
        b.send_message(client.session_id, note(n))
    assert notes(client, 5) == [0, 1, 2, 3, 4]
    b.send_tool_update(client.session_id, "no-such-call")  # unknown call: nothing is sent
    with pytest.raises(SessionNotFound):
        b.send_message("no-such-session", note(0))


def test_broadcast_reaches_every_session_on_every_node_once(
        make_node: Callable[..., ProtoServer]) -> None:
    a, b = make_node(), make_node()
    clients = [WSClient(a.base_url, a.issue_token("u1")), WSClient(a.base_url, a.issue_token("u2")),
               WSClient(b.base_url, b.issue_token("u3"))]
    try:
        for c in clients:
            c.hello()
        wait_for(lambda: b.get_stats()["activeConnections"] == 3, what="both nodes counted")
        assert b.broadcast(note(1)) == 1  # reached on this node; the others through Redis
        a.broadcast(note(2))
        for c in clients:  # a marker sent after both: anything duplicated would come first
            b.send_message(c.session_id, {"type": "MARK", "channel": "AGENT", "payload": {}})
        for c in clients:
            c.recv_type("MARK")
            got = [m["payload"]["n"] for m in c.received if m["type"] == "NOTE"]
            assert sorted(got) == [1, 2], (c.session_id, got)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("cls", [SSEClient, StreamClient], ids=["sse", "stream"])
def test_a_follow_up_post_to_another_node_reaches_the_session(
        make_node: Callable[..., ProtoServer], cls: type) -> None:
    a, b = make_node(), make_node()
    client = cls(a.base_url, a.issue_token("alice"))
    try:
        if cls is StreamClient:
            client.send("HELLO", "SYSTEM", {"proto_version": "1.1.2", "accept_major": [1],
                                            "accept_events": []})
            client.session_id = client.recv_type("HELLO")["payload"]["session"]
            client.end_body()
        else:
            client.hello()
        env = client.envelopes.make("TOOL_CALL", payload={
            "call_id": "k1", "tool": "add", "params": {"a": 2, "b": 40}})
        path = "/proto/sse" if cls is SSEClient else "/proto/stream"
        resp = requests.post(f"{b.base_url}{path}?session={client.session_id}",
                             json=env, headers={"Authorization": f"Bearer {client.token}"},
                             timeout=timeout(5))
        assert resp.status_code == 202 and resp.json() == {"accepted": 1}
        done = client.recv_type("TOOL_DONE")
        assert done["payload"]["result"] == {"result": 42}
        # the other node checks the owner like its own: another user's token is refused
        resp = requests.post(f"{b.base_url}{path}?session={client.session_id}",
                             json=client.envelopes.make("PING", "SYSTEM", {"nonce": "x"}),
                             headers={"Authorization": f"Bearer {b.issue_token('mallory')}"},
                             timeout=timeout(5))
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "SESSION_NOT_FOUND"
    finally:
        client.close()


def test_get_session_and_stats_answer_for_the_whole_cluster(
        make_node: Callable[..., ProtoServer]) -> None:
    a, b = make_node(), make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        run = a.start_run(client.session_id, "r1")
        assert run["runId"] == "r1"
        client.recv_type("RUN_STARTED")

        def remote_view() -> dict[str, Any] | None:
            view = b.get_session(client.session_id)
            return view if view and view["activeRuns"] == {"r1"} else None

        view = wait_for(remote_view, what="the session's record on the other node")
        assert view["userId"] == "alice" and view["connected"] is True
        assert view["handshakeCompleted"] is True
        assert int(view["lastDeliveredSeq"]) >= 2
        assert b.get_session("nope") is None

        stats = wait_for(lambda: (s := b.get_stats())["activeConnections"] == 1 and s,
                         what="cluster stats")
        assert {n["node"] for n in stats["nodes"]} == {a.hub.node_id, b.hub.node_id}
        assert stats["node"] == b.hub.node_id
        health = requests.get(b.base_url + "/health", timeout=timeout(5)).json()
        assert health["status"] == "ok" and health["activeConnections"] == 1
        assert len(health["nodes"]) == 2

        client.close()
        wait_for(lambda: b.get_session(client.session_id)["connected"] is False,
                 what="the disconnect seen from the other node")
    finally:
        client.close()


def test_resume_on_another_node_moves_the_session_and_replays_what_was_missed(
        make_node: Callable[..., ProtoServer], transport: str) -> None:
    from ..support import CLIENTS

    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    first = CLIENTS[transport](a.base_url, token)
    try:
        first.hello() if transport != "stream" else _stream_hello(first)
        b.send_message(first.session_id, note(0))
        notes(first, 1)
        seen = int(first.received[-1]["seq"])
        first.drop()
        wait_for(lambda: a.get_session(first.session_id)["connected"] is False,
                 what="node a to see the drop")
        for n in range(1, 4):  # sent while no transport is attached, from either node
            (a if n % 2 else b).send_message(first.session_id, note(n))
        second = CLIENTS[transport](b.base_url, token, session=first.session_id,
                                    last_seq=seen)
        try:
            assert notes(second, 3) == [1, 2, 3]
            seqs = [int(m["seq"]) for m in second.received]
            assert seqs == sorted(seqs) and seqs[0] == seen + 1
            assert b.hub.get(first.session_id) is not None
            assert a.hub.get(first.session_id) is None
            a.send_message(first.session_id, note(4))  # from the old node: still arrives
            assert notes(second, 1) == [4]
            second.envelopes = first.envelopes  # the client's seqs go on where they were
            second.send("PING", "SYSTEM", {"nonce": "after-move"})
            second.recv_type("PONG", nonce="after-move")
        finally:
            second.close()
    finally:
        first.close()


def _stream_hello(client: Any) -> None:
    client.send("HELLO", "SYSTEM", {"proto_version": "1.1.2", "accept_major": [1],
                                    "accept_events": []})
    client.session_id = client.recv_type("HELLO")["payload"]["session"]


def test_a_live_connection_is_superseded_by_a_resume_on_another_node(
        make_node: Callable[..., ProtoServer]) -> None:
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    first = WSClient(a.base_url, token)
    try:
        first.hello()
        second = WSClient(b.base_url, token, session=first.session_id, last_seq=0)
        try:
            second.recv_type("HELLO")  # replayed from seq 1
            wait_for(lambda: first.close_code == 4002 or not first.is_open(),
                     what="the old connection closed with 4002")
            assert first.close_code == 4002
            # what the client had sent before counts: its next seq is accepted, no resend
            second.envelopes = first.envelopes
            second.send("PING", "SYSTEM", {"nonce": "n"})
            second.recv_type("PONG", nonce="n")
        finally:
            second.close()
    finally:
        first.close()


class ToolOnTheMove:
    """A tool on node a that runs until released; its session moves to node b mid-call."""

    def __init__(self, a: ProtoServer, b: ProtoServer) -> None:
        import threading

        self.started, self.release, self.stopped = (threading.Event(), threading.Event(),
                                                    threading.Event())

        @a.tool("slow", input_schema={"type": "object"})
        def slow(params: dict[str, Any], *context: Any) -> dict[str, Any]:
            import gevent
            self.started.set()
            try:
                while not self.release.is_set():
                    gevent.sleep(0.01)
            finally:
                self.stopped.set()
            return {"done": True}

        token = a.issue_token("alice")
        self.first = WSClient(a.base_url, token)
        self.first.hello()
        self.first.send("TOOL_CALL", payload={"call_id": "s1", "tool": "slow", "params": {}})
        assert self.started.wait(timeout(5))
        seen = int(self.first.received[-1]["seq"])
        self.first.drop()
        self.second = WSClient(b.base_url, token, session=self.first.session_id,
                               last_seq=seen)
        self.second.envelopes = self.first.envelopes  # the client's seqs go on
        wait_for(lambda: b.hub.get(self.first.session_id) is not None, what="the move")

    def close(self) -> None:
        self.release.set()
        self.first.close()
        self.second.close()


def test_a_tool_still_running_when_its_session_moves_reports_to_the_new_node(
        make_node: Callable[..., ProtoServer]) -> None:
    move = ToolOnTheMove(make_node(), make_node())
    try:
        move.release.set()
        done = move.second.recv_type("TOOL_DONE")
        assert done["payload"] == {"call_id": "s1", "status": "OK", "result": {"done": True}}
    finally:
        move.close()


def test_sessions_of_a_stopped_node_are_resumed_elsewhere(
        make_node: Callable[..., ProtoServer]) -> None:
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        for n in range(3):
            a.send_message(client.session_id, note(n))
        assert notes(client, 3) == [0, 1, 2]
        a.stop()
        assert client.ws.close_code in (1001, None)
    finally:
        client.close()
    b.send_message(client.session_id, note(3))  # no node holds it: queued in Redis
    again = WSClient(b.base_url, token, session=client.session_id, last_seq=0)
    try:
        assert notes(again, 4) == [0, 1, 2, 3]
    finally:
        again.close()


def test_cancelling_a_tool_that_started_on_the_old_node_stops_it_there(
        make_node: Callable[..., ProtoServer]) -> None:
    move = ToolOnTheMove(make_node(), make_node())
    try:
        move.second.send("TOOL_CANCEL", payload={"call_id": "s1"})
        done = move.second.recv_type("TOOL_DONE")
        assert done["payload"] == {"call_id": "s1", "status": "CANCELLED"}
        assert move.stopped.wait(timeout(5)), "the tool kept running on the old node"
        move.second.send("PING", "SYSTEM", {"nonce": "n"})
        move.second.recv_type("PONG", nonce="n")
        assert [m["type"] for m in move.second.received].count("TOOL_DONE") == 1
    finally:
        move.close()


def test_an_expired_session_leaves_no_keys_behind(make_node: Callable[..., ProtoServer],
                                                   rdb, prefix: str) -> None:
    a = make_node(replayWindowTime=300)
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        a.send_message(client.session_id, note(1))
        client.recv_type("NOTE")
        assert rdb.exists(f"{prefix}:s:{client.session_id}", f"{prefix}:r:{client.session_id}") == 2
    finally:
        client.close()
    wait_for(lambda: a.hub.get(client.session_id) is None, what="the session to expire")
    # (the node forgets the session, then deletes its keys: a round trip later)
    wait_for(lambda: rdb.keys(f"{prefix}:*:{client.session_id}") == [], what="no keys left")


def test_metrics_on_any_node_cover_every_node(make_node: Callable[..., ProtoServer]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    a, b = make_node(), make_node()
    clients = [WSClient(a.base_url, a.issue_token("u1")), WSClient(a.base_url, a.issue_token("u2")),
               WSClient(b.base_url, b.issue_token("u3"))]
    try:
        for c in clients:
            c.hello()

        def active() -> dict[str, float]:
            text = requests.get(b.base_url + "/metrics", timeout=timeout(5)).text
            family = next(f for f in text_string_to_metric_families(text)
                          if f.name == "protoflask_connections_active")
            return {s.labels["node"]: s.value for s in family.samples
                    if s.labels["transport"] == "websocket"}

        assert wait_for(lambda: active() == {a.hub.node_id: 2, b.hub.node_id: 1} or None,
                        what="both nodes' connections in b's /metrics")
        local = requests.get(b.base_url + "/metrics?scope=node", timeout=timeout(5)).text
        assert a.hub.node_id not in local and 'transport="websocket"' in local
        # a flood of scrapes parses the other nodes' texts once per OTHERS_TTL, not once
        # each (the TTL is stretched here so that the count does not depend on time)
        others = b.hub.view._others
        others.ttl = 3600.0
        before = others.parses
        for _ in range(20):
            requests.get(b.base_url + "/metrics", timeout=timeout(5)).raise_for_status()
        assert others.parses - before == 0, others.parses - before
    finally:
        for c in clients:
            c.close()


def test_a_node_that_lost_its_session_to_another_stops_serving_it(
        make_node: Callable[..., ProtoServer], rdb, prefix: str) -> None:
    # As if another node had taken the session over while this one did not answer: its
    # next journal write is fenced off, and it lets its client go (4004) writing nothing.
    a = make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        key = f"{prefix}:s:{client.session_id}"
        rdb.hset(key, "node", "some-other-node")
        before = rdb.llen(f"{prefix}:r:{client.session_id}")
        a.send_message(client.session_id, note(1))
        wait_for(lambda: client.close_code == 4004 or not client.is_open(),
                 what="the client let go")
        assert client.close_code == 4004  # moved, not superseded: the client resumes
        assert a.hub.get(client.session_id) is None
        assert rdb.hget(key, "node") == b"some-other-node"
        assert rdb.llen(f"{prefix}:r:{client.session_id}") == before  # nothing written
    finally:
        client.close()


def test_two_resumes_racing_on_two_nodes_leave_one_holder(
        make_node: Callable[..., ProtoServer]) -> None:
    import threading

    a, b, c = make_node(), make_node(), make_node()
    token = a.issue_token("alice")
    first = WSClient(a.base_url, token)
    first.hello()
    sid = first.session_id
    first.drop()
    wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
    resumed: dict[str, WSClient] = {}

    def resume(node: ProtoServer, name: str) -> None:
        resumed[name] = WSClient(node.base_url, token, session=sid, last_seq=0)

    threads = [threading.Thread(target=resume, args=(n, name)) for n, name in ((b, "b"), (c, "c"))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout(15))
        assert set(resumed) == {"b", "c"}
        holders = wait_for(lambda: (h := [n for n in (a, b, c) if n.hub.get(sid)]) and
                           len(h) == 1 and h, what="a single holder")
        survivor = resumed["b" if holders[0] is b else "c"]
        loser = resumed["c" if holders[0] is b else "b"]
        wait_for(lambda: loser.close_code == 4002 or not loser.is_open(),
                 what="the earlier resume superseded")
        a.send_message(sid, note(7))
        assert survivor.recv_type("NOTE")["payload"]["n"] == 7
    finally:
        for client in (first, *resumed.values()):
            client.close()


def test_a_delivery_that_finds_the_holder_not_listening_arrives_at_its_next_beat(
        make_node: Callable[..., ProtoServer], rdb, prefix: str) -> None:
    import orjson

    a = make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        # what another node does when PUBLISH reaches no one while a is the holder
        sid = client.session_id
        rdb.rpush(f"{prefix}:in:{sid}", orjson.dumps({"name": "send", "args": [note(5)]}))
        rdb.sadd(f"{prefix}:queued:{a.hub.node_id}", sid)
        assert client.recv_type("NOTE", within=5)["payload"]["n"] == 5
        assert rdb.llen(f"{prefix}:in:{sid}") == 0
    finally:
        client.close()


def test_a_call_left_running_on_a_node_that_then_stops_ends_once(
        make_node: Callable[..., ProtoServer]) -> None:
    """The session moved to node b while its call ran on a; a stops (drain) before the
    call reports: a cancels it and its one TOOL_DONE CANCELLED reaches b while a can
    still reach Redis (before: nothing until b's watch saw a's beat gone, then an
    ERROR), and the call_id is free again. (A node killed outright: b's watch ends the
    call with TOOL_EXECUTION_ERROR, test_cluster_processes.)"""
    a, b = make_node(), make_node()
    move = ToolOnTheMove(a, b)
    try:
        a.stop()
        done = move.second.recv_type("TOOL_DONE", within=15, call_id="s1")
        assert done["payload"]["status"] == "CANCELLED", done
        move.second.send("TOOL_CALL", payload={"call_id": "s1", "tool": "add",
                                               "params": {"a": 1, "b": 1}})
        assert move.second.recv_type("TOOL_DONE", call_id="s1")["payload"]["status"] == "OK"
        move.second.send("PING", "SYSTEM", {"nonce": "n"})
        move.second.recv_type("PONG", nonce="n")
        assert [m["payload"]["status"] for m in move.second.received
                if m["type"] == "TOOL_DONE"] == ["CANCELLED", "OK"]
    finally:
        move.close()


def test_a_call_cancelled_by_a_drain_reports_once_to_the_next_holder(
        make_node: Callable[..., ProtoServer]) -> None:
    """Node a stops (drain) while a call of its session runs there: the cancelled call's
    TOOL_DONE follows the session to its next holder (not into the core a let go), once,
    and the seqs the client reads go on without a gap."""
    a, b = make_node(), make_node()
    started = hanging_tool(a)

    token = a.issue_token("alice")
    first = WSClient(a.base_url, token)
    first.hello()
    first.send("TOOL_CALL", payload={"call_id": "s1", "tool": "slow", "params": {}})
    assert started.wait(timeout(5))
    seen = int(first.received[-1]["seq"])
    a.stop()
    first.close()
    again = WSClient(b.base_url, token, session=first.session_id, last_seq=seen)
    try:
        again.envelopes = first.envelopes
        done = again.recv_type("TOOL_DONE", within=15, call_id="s1")
        assert done["payload"]["status"] == "CANCELLED"
        again.send("PING", "SYSTEM", {"nonce": "n"})
        again.recv_type("PONG", nonce="n")
        assert [m["type"] for m in again.received].count("TOOL_DONE") == 1
        seqs = [int(m["seq"]) for m in again.received]
        assert seqs == list(range(seen + 1, seen + 1 + len(seqs))), (seen, seqs)
    finally:
        again.close()

