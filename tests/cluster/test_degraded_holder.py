"""A node still degraded (Redis refuses its writes: what it sent since is not copied over
yet) keeps its sessions: a resume elsewhere gets 503 and is retried, and once the holder
has copied everything back the resume replays the whole window, without a hole.

The node is cut off from Redis alone (the other keeps working, as after an outage one
node recovers before another, or while its copying back fails): it connects as its own
Redis user, and the test takes that user's scripts away (every session write is a
script; the beat and the listener are not, so the node stays alive and listening)."""

from __future__ import annotations

from typing import Callable

import redis
import requests

from protoflask import ProtoServer

from ..support import PrivateRedis, WSClient, timeout, wait_for
from .notes import note
from .retry import status_of, when_served

USER, PASSWORD = "node-a", "node-a-secret"


def health(node: ProtoServer) -> str:
    return requests.get(node.base_url + "/health", timeout=timeout(5)).json()["status"]


def test_a_degraded_holder_keeps_its_session_and_the_resume_elsewhere_replays_all(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"],
                      channels=["*"], commands=["+@all"])
    a = make_server(redisUrl=private_redis.url.replace("redis://",
                                                       f"redis://{USER}:{PASSWORD}@"))
    b = make_server(redisUrl=private_redis.url)
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        a.send_message(sid, note(0))
        client.recv_type("NOTE")

        # Redis refuses a's session writes from now on: a degrades, keeps serving
        admin.acl_setuser(USER, enabled=True, commands=["-eval", "-evalsha"])
        for n in (1, 2):
            a.send_message(sid, note(n))
        assert [client.recv_type("NOTE")["payload"]["n"] for _ in range(2)] == [1, 2]
        wait_for(lambda: health(a) == "degraded", what="node a to degrade")
        assert health(b) == "ok"
        seen = int(client.received[-1]["seq"])
        client.drop()
        for n in (3, 4):  # sent while the client is away, still only in a's memory
            a.send_message(sid, note(n))

        try:
            WSClient(b.base_url, token, session=sid, last_seq=seen).close()
            raise AssertionError("b took the session from a degraded holder")
        except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
            assert status_of(exc) == 503, exc
            assert exc.response.headers["Retry-After"]  # type: ignore[attr-defined]
            assert b"CLUSTER_UNAVAILABLE" in exc.response.body  # type: ignore[attr-defined]
        assert a.hub.get(sid) is not None and b.hub.get(sid) is None

        admin.acl_setuser(USER, enabled=True, commands=["+@all"])  # a copies back
        resumed = when_served(lambda: WSClient(b.base_url, token, session=sid,
                                               last_seq=seen), within=15)
        try:
            assert [resumed.recv_type("NOTE")["payload"]["n"] for _ in range(2)] == [3, 4]
            seqs = [int(m["seq"]) for m in resumed.received]
            assert seqs == list(range(seen + 1, seen + 1 + len(seqs))), (seen, seqs)
            assert not [m for m in resumed.received if m["type"] == "ERROR"]
        finally:
            resumed.close()
    finally:
        client.close()
        admin.close()
