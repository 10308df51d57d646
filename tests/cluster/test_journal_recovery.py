"""The journal cannot die silently: whatever a flush meets (the script gone after SCRIPT
FLUSH, a Redis restarted empty, a value in Redis of the wrong type, a state orjson or no
encoder at all can write, its own greenlet killed), the cluster carries on by itself,
/health says "degraded" only while the journal cannot write, and the clients of both
nodes see every message once: their seqs run on without a gap, and a resume on the other
node replays exactly what they were sent."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import pytest
import redis
import requests

from protoflask import ProtoServer
from protoflask.cluster.state import decode_state
from protoflask.core.session import Run

from ..support import PrivateRedis
from .notes import note
from ..support import WSClient, timeout, wait_for

Nodes = tuple[ProtoServer, ProtoServer]


def health(node: ProtoServer) -> str:
    return requests.get(node.base_url + "/health", timeout=timeout(5)).json()["status"]


class Pair:
    """A client on each node; each gets notes sent from the other node, and PINGs."""

    def __init__(self, a: ProtoServer, b: ProtoServer) -> None:
        self.a, self.b = a, b
        self.ca = WSClient(a.base_url, a.issue_token("alice"))
        self.cb = WSClient(b.base_url, b.issue_token("bob"))
        self.ca.hello()
        self.cb.hello()
        self.sent = 0

    def exchange(self, count: int = 5, *, local: bool = False) -> None:
        """``count`` notes to each client (from the other node, or with ``local`` from its
        own: what works while Redis is away), then a PING each; all must arrive in order."""
        first = self.sent
        for n in range(first, first + count):
            (self.a if local else self.b).send_message(self.ca.session_id, note(n))
            (self.b if local else self.a).send_message(self.cb.session_id, note(n))
        self.sent += count
        for client in (self.ca, self.cb):
            got = [client.recv_type("NOTE")["payload"]["n"] for _ in range(count)]
            assert got == list(range(first, first + count))
            client.send("PING", "SYSTEM", {"nonce": f"p{first}"})
            client.recv_type("PONG", nonce=f"p{first}")

    def check_once_each(self) -> None:
        """Seqs without gap or repeat on both clients; then alice's session resumed on
        node b replays exactly what she received (so Redis holds all of it, once)."""
        for client in (self.ca, self.cb):
            seqs = [int(m["seq"]) for m in client.received]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        hello_seq = int(self.ca.received[0]["seq"])
        expected = [(m["seq"], m["type"], m["payload"]) for m in self.ca.received[1:]]
        self.ca.drop()
        resumed = WSClient(self.b.base_url, self.b.issue_token("alice"),
                           session=self.ca.session_id, last_seq=hello_seq)
        try:
            replayed = [resumed.recv() for _ in expected]
            assert [(m["seq"], m["type"], m["payload"]) for m in replayed] == expected
            resumed.envelopes = self.ca.envelopes
            resumed.send("PING", "SYSTEM", {"nonce": "after"})
            assert resumed.recv()["payload"].get("nonce") == "after"  # nothing doubled
        finally:
            resumed.close()

    def close(self) -> None:
        self.ca.close()
        self.cb.close()


def recovered(pair: Pair, since: float) -> float:
    """Wait for both nodes to answer ok again; seconds since ``since``."""
    wait_for(lambda: health(pair.a) == "ok" and health(pair.b) == "ok", within=5,
             what="both nodes healthy again")
    return time.monotonic() - since


def run(two_nodes: Nodes, fault: Callable[[Pair], Any], *, local: bool = False) -> None:
    pair = Pair(*two_nodes)
    try:
        pair.exchange()
        started = time.monotonic()
        fault(pair)
        pair.exchange(local=local)
        print(f"recovered in {recovered(pair, started):.2f}s")
        pair.exchange()
        pair.check_once_each()
    finally:
        pair.close()


def test_script_flush_is_survived(two_nodes: Nodes, private_redis: PrivateRedis) -> None:
    def flush_scripts(pair: Pair) -> None:
        redis.Redis.from_url(private_redis.url).script_flush()

    run(two_nodes, flush_scripts)


def test_a_redis_restarted_empty_is_survived(two_nodes: Nodes,
                                             private_redis: PrivateRedis) -> None:
    def restart(pair: Pair) -> None:
        private_redis.kill()
        wait_for(lambda: health(pair.a) == "degraded", what="node a to notice")
        pair.exchange(local=True)  # sessions keep working meanwhile
        private_redis.start()

    run(two_nodes, restart, local=True)


def test_a_value_of_the_wrong_type_in_redis_is_repaired(two_nodes: Nodes,
                                                        private_redis: PrivateRedis) -> None:
    def poison(pair: Pair) -> None:
        r = redis.Redis.from_url(private_redis.url)
        key = f"protoflask:r:{pair.ca.session_id}"
        r.delete(key)
        r.set(key, "not a list")  # the append script fails: WRONGTYPE

    run(two_nodes, poison)


BEYOND_64_BITS = 10 ** 64


@pytest.mark.parametrize("path", ["state line", "whole export"])
def test_a_state_orjson_cannot_encode_is_journaled(two_nodes: Nodes, path: str) -> None:
    """A message id counter beyond 64 bits (orjson refuses it) reaches Redis exactly, on
    both ways a state is written: the journal's state line (cluster/state.py's
    StateLine, which writes the moving numbers itself) and, while a run is open, the
    whole export (encode_state, which falls back to the standard library's encoder).
    The session resumed on node b carries it on (its counter came from Redis)."""
    a, b = two_nodes
    sid = ""

    def poison(pair: Pair) -> None:
        nonlocal sid
        sid = pair.ca.session_id
        live = a.hub.get(sid)

        def set_counter() -> None:
            live.core.id_counter = BEYOND_64_BITS
            if path == "whole export":  # an open run: the state line steps aside
                live.core.registry.runs["r"] = Run("r", 0)  # (runs: a read-only view)
        a._call(set_counter)

    run(two_nodes, poison)
    r = redis.Redis.from_url(b.config.redis_url)
    try:
        raw = r.hget(f"{b.config.redis_prefix}:s:{sid}", "state")
    finally:
        r.close()
    assert raw is not None, "no state journaled"
    assert decode_state(raw)["counter"] >= BEYOND_64_BITS
    resumed = b.hub.get(sid)
    assert resumed is not None and resumed.core.id_counter >= BEYOND_64_BITS


def test_a_state_nothing_can_encode_leaves_the_messages_journaled(two_nodes: Nodes) -> None:
    a, _ = two_nodes

    def poison(pair: Pair) -> None:
        live = a.hub.get(pair.ca.session_id)
        cycle: dict[str, Any] = {}
        cycle["self"] = cycle
        a._call(lambda: live.core.registry.runs.__setitem__("r", Run("r", 0, metadata=cycle)))

    run(two_nodes, poison)


def test_a_killed_flusher_is_started_again(two_nodes: Nodes) -> None:
    a, _ = two_nodes

    def kill(pair: Pair) -> None:
        a._call(lambda: a.hub.journal._flusher.kill())

    run(two_nodes, kill)
    assert a.hub.journal.restarts == 1


def test_a_redis_that_refuses_writes_reads_degraded_and_logs_once(
        two_nodes: Nodes, private_redis: PrivateRedis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Redis answers but refuses every write (out of memory): /health says degraded for as
    long as it lasts (the journal cannot write), a handful of lines are logged however
    many messages go out, and once writes work again nothing was lost."""
    r = redis.Redis.from_url(private_redis.url)

    def refuse_writes(pair: Pair) -> None:
        r.config_set("maxmemory", 1)  # noeviction: every write is refused with OOM
        with caplog.at_level(logging.ERROR, logger="protoflask.cluster"):
            for _ in range(4):
                pair.exchange(local=True)  # 20 notes to each client, all delivered
            wait_for(lambda: health(pair.a) == "degraded" and health(pair.b) == "degraded",
                     what="both nodes to say they cannot write")
        lines = [rec for rec in caplog.records if rec.name == "protoflask.cluster"]
        assert 0 < len(lines) <= 6, [rec.getMessage() for rec in lines]
        r.config_set("maxmemory", 0)

    try:
        run(two_nodes, refuse_writes, local=True)
    finally:
        r.config_set("maxmemory", 0)
        r.close()
