"""A session's record says whether it is connected and on which transport (what other
nodes' lookups and dashboards read). An attach or a detach writes those fields with the
session's next journal batch, fenced like every batch, instead of a write of its own:
a resume on the node holding the session makes no round trip of its own to Redis
(docs/PERFORMANCE.md, p7-storm, "storm3resume"). An attach still waits for that batch,
so a node that lost the session meanwhile lets the client go (4004) having served it
at most the replay of what Redis has, as when the record was a write of its own."""

from __future__ import annotations

from typing import Any, Callable

import redis

from protoflask import ProtoServer

from ..support import PrivateRedis, WSClient, wait_for


def evals(rdb: redis.Redis) -> int:
    """EVAL calls Redis served (a record write is one; the journal's batches are
    EVALSHA)."""
    stats: dict[str, Any] = rdb.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


def alone(make_server: Callable[..., ProtoServer], private_redis: PrivateRedis
          ) -> tuple[ProtoServer, redis.Redis, str, WSClient]:
    """A node alone on a private Redis (whose scripts and commands a test may count or
    flush), a client of user alice on it, and that Redis's own client."""
    node = make_server(redisUrl=private_redis.url)
    token = node.issue_token("alice")
    return node, redis.Redis.from_url(private_redis.url), token, WSClient(node.base_url, token)


def pings(client: WSClient, n: int) -> int:
    """``n`` PINGs answered; the seq of the last PONG."""
    for i in range(n):
        client.send("PING", "SYSTEM", {"nonce": f"n{i}"})
    return max(int(client.recv_type("PONG", nonce=f"n{i}")["seq"]) for i in range(n))


def test_a_resume_writes_its_record_with_the_batch_not_in_a_round_trip_of_its_own(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis) -> None:
    node, rdb, token, client = alone(make_server, private_redis)
    resumed = None
    try:
        hello = client.hello()
        sid = client.session_id
        key = f"{node.config.redis_prefix}:s:{sid}"
        record = lambda: rdb.hmget(key, "connected", "transport")  # noqa: E731
        wait_for(lambda: record() == [b"1", b"websocket"], what="the record: connected")
        last = pings(client, 3)
        before = evals(rdb)
        client.drop()
        wait_for(lambda: record() == [b"0", b""], what="the record: the drop")
        resumed = WSClient(node.base_url, token, session=sid, last_seq=hello["seq"])
        seqs = [int(resumed.recv()["seq"]) for _ in range(3)]
        assert seqs == [last - 2, last - 1, last]  # the PONGs, once each
        wait_for(lambda: record() == [b"1", b"websocket"], what="the record: the resume")
        assert evals(rdb) == before  # neither the drop nor the resume wrote on its own
    finally:
        client.close()
        if resumed is not None:
            resumed.close()
        rdb.close()


def test_a_resume_on_a_node_that_lost_the_session_meanwhile_is_let_go_unserved(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    a = make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    resumed = None
    try:
        hello = client.hello()
        sid = client.session_id
        last = pings(client, 2)
        client.drop()
        wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
        key = f"{prefix}:s:{sid}"
        wait_for(lambda: rdb.hget(key, "connected") == b"0", what="the record: the drop")
        # as if another node had taken the session over while this one did not answer
        rdb.hset(key, "node", "some-other-node")
        resumed = WSClient(a.base_url, token, session=sid, last_seq=hello["seq"])
        wait_for(lambda: resumed.close_code == 4004 or not resumed.is_open(),
                 what="the resume let go")
        assert resumed.close_code == 4004  # moved: the client resumes it there
        # at most the replay of what Redis has (the next holder replays the same)
        assert {int(m["seq"]) for m in resumed.received} <= set(range(2, last + 1))
        assert a.hub.get(sid) is None
        assert rdb.hmget(key, "node", "connected") == [b"some-other-node", b"0"]
    finally:
        client.close()
        if resumed is not None:
            resumed.close()


def test_the_record_is_written_when_the_batch_is_sent_again_after_a_script_flush(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis) -> None:
    node, rdb, token, client = alone(make_server, private_redis)
    resumed = None
    try:
        hello = client.hello()
        sid = client.session_id
        key = f"{node.config.redis_prefix}:s:{sid}"
        client.drop()
        wait_for(lambda: rdb.hget(key, "connected") == b"0", what="the record: the drop")
        rdb.script_flush()  # the resume's batch meets NOSCRIPT and is sent again
        resumed = WSClient(node.base_url, token, session=sid, last_seq=hello["seq"])
        resumed.envelopes = client.envelopes  # its upstream seqs go on
        resumed.send("PING", "SYSTEM", {"nonce": "after"})
        resumed.recv_type("PONG", nonce="after")
        wait_for(lambda: rdb.hmget(key, "connected", "transport") == [b"1", b"websocket"],
                 what="the record: the resume")
    finally:
        client.close()
        if resumed is not None:
            resumed.close()
        rdb.close()
