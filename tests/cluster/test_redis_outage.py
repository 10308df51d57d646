"""Redis going away degrades a node, it does not stop it: local sessions keep working,
/health says degraded, what needs Redis fails with CLUSTER_UNAVAILABLE instead of being
lost, and once Redis is back (empty: it keeps nothing on disk) every session is copied
over again, so a resume on another node still replays what was sent during the outage."""

from __future__ import annotations

import signal
import time
from typing import Callable

import pytest
import redis
import requests

from protoflask import ProtoServer
from protoflask.core.errors import ClusterUnavailable

from ..support import PrivateRedis
from .notes import note
from ..support import WSClient, timeout, wait_for


def health(node: ProtoServer) -> str:
    return requests.get(node.base_url + "/health", timeout=timeout(5)).json()["status"]


def test_a_redis_outage_degrades_and_loses_nothing(
        two_nodes: tuple[ProtoServer, ProtoServer], private_redis: PrivateRedis) -> None:
    a, b = two_nodes
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        a.send_message(client.session_id, note(0))
        client.recv_type("NOTE")

        private_redis.kill()
        wait_for(lambda: health(a) == "degraded", what="node a to notice the outage")
        # this node's own sessions keep working
        client.send("PING", "SYSTEM", {"nonce": "during"})
        client.recv_type("PONG", nonce="during")
        client.send("TOOL_CALL", payload={"call_id": "t1", "tool": "add",
                                          "params": {"a": 1, "b": 2}})
        assert client.recv_type("TOOL_DONE")["payload"]["result"] == {"result": 3}
        for n in (1, 2):
            a.send_message(client.session_id, note(n))
        assert [client.recv_type("NOTE")["payload"]["n"] for _ in range(2)] == [1, 2]
        # what needs Redis says so rather than losing the message
        with pytest.raises(ClusterUnavailable):
            b.send_message(client.session_id, note(99))
        seen = int(client.received[-1]["seq"])
        a.send_message(client.session_id, note(3))  # sent, maybe unread, during the outage
        client.drop()

        private_redis.start()  # back, and empty
        wait_for(lambda: health(a) == "ok" and health(b) == "ok", within=15,
                 what="both nodes to reconnect")
        resumed = WSClient(b.base_url, token, session=client.session_id, last_seq=seen)
        try:
            assert resumed.recv_type("NOTE")["payload"]["n"] == 3
            assert b.hub.get(client.session_id) is not None
        finally:
            resumed.close()
    finally:
        client.close()



def test_redis_losing_its_data_without_an_outage_is_noticed_and_repaired(
        two_nodes: tuple[ProtoServer, ProtoServer], private_redis: PrivateRedis) -> None:
    a, b = two_nodes
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        a.send_message(client.session_id, note(1))
        seen = int(client.recv_type("NOTE")["seq"]) - 1
        r = redis.Redis.from_url(private_redis.url)
        r.flushall()  # as a restart without persistence would, but no connection drops
        wait_for(lambda: r.exists(f"protoflask:s:{client.session_id}"), within=10,
                 what="node a to copy its session over again")
        r.close()
        client.drop()
        resumed = WSClient(b.base_url, token, session=client.session_id, last_seq=seen)
        try:
            assert resumed.recv_type("NOTE")["payload"]["n"] == 1
        finally:
            resumed.close()
    finally:
        client.close()


def test_a_redis_that_stops_answering_holds_no_writer_past_the_journals_wait(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis) -> None:
    """Redis stopped (SIGSTOP: unreachable, every command waits for its socket timeout):
    the holder's writers wait for the journal WAIT_LIMIT at most, then carry on from
    memory, so the heartbeat (here a PING every second, 4 s to answer) never times out.
    Before, a batch in flight held its writers until its write gave up, on the journal's
    own connection and then again on a fresh one (twice the 5 s timeout): the PING
    behind it timed the client out. In the soak such a client, resuming on another node,
    was refused until Redis came back 60 s later, past replayWindowTime: its oldest
    messages were gone (declared by REPLAY_UNAVAILABLE, the 60 s outage's rows)."""
    a = make_server(redisUrl=private_redis.url, heartbeatInterval=1000,
                    heartbeatTimeout=4000)
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    proc = private_redis.proc
    assert proc is not None
    try:
        client.hello()
        sid = client.session_id
        a.send_message(sid, note(0))
        client.recv_type("NOTE")
        proc.send_signal(signal.SIGSTOP)
        got = []
        for n in range(1, 9):
            a.send_message(sid, note(n))
            until = time.monotonic() + 1
            while time.monotonic() < until:
                msg = client.recv(within=10)  # (raises if the server closed the socket)
                if msg["type"] == "PING":
                    client.send("PONG", "SYSTEM", {"nonce": msg["payload"]["nonce"]})
                elif msg["type"] == "NOTE":
                    got.append(msg["payload"]["n"])
        assert got == list(range(1, len(got) + 1)) and len(got) >= 6, got
        assert client.is_open()
        assert not [m for m in client.received if m["type"] == "ERROR"]
    finally:
        proc.send_signal(signal.SIGCONT)
        client.close()
