"""A delivery from another node (``send_message``, a tool's update or result, an AG-UI
handler's ``stream_text`` after a re-attach elsewhere) whose holder dies before
confirming it arrives exactly once: the sender queues a copy for the next holder, and
the copy is skipped when the dead holder had it already (the delivery's id moves with the
session's state). Real gunicorn holders SIGKILLed, an embedded sender, a private Redis.

The two ways a holder dies with a delivery unconfirmed, each made certain rather than
timed: it heard the delivery and never read it (its worker stopped, SIGSTOP, before the
delivery was sent); it applied it and Redis has it, but its confirmation never left
(the holder's Redis user may not write the one-shot reply keys)."""

from __future__ import annotations

import os
import signal
from typing import Callable, Iterator

import orjson
import pytest
import redis
import requests

from protoflask import ProtoServer

from ..support import GunicornServer, PrivateRedis, WSClient, timeout
from .notes import note
from .retry import when_served

APP = "tests.fixtures.agui_app:app"  # protoflask, and /test/pid naming the worker
PREFIX = "protoflask"


@pytest.fixture
def nodes() -> Iterator[list[GunicornServer]]:
    started: list[GunicornServer] = []
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def holder(private_redis: PrivateRedis, nodes: list[GunicornServer],
           url: str | None = None) -> tuple[GunicornServer, int]:
    """A gunicorn node on the private Redis (as ``url``'s user, if given), and its
    worker's pid."""
    node = GunicornServer({"REDIS_URL": url or private_redis.url, "REDIS_PREFIX": PREFIX},
                          app=APP)
    nodes.append(node)
    pid = requests.get(node.base_url + "/test/pid", timeout=timeout(5)).json()["pid"]
    return node, pid


def kill(node: GunicornServer, worker: int) -> None:
    """SIGKILL the worker and the master (the machine is gone)."""
    os.kill(worker, signal.SIGKILL)
    node.kill()


def notes_after_resume(sender: ProtoServer, token: str, sid: str,
                       last_seq: int) -> list[int]:
    """Resume the session on the sender's node (it takes the session over from the dead
    holder, with the queued copy), send NOTE 2 there, and return the NOTEs' numbers the
    client got up to it: anything the take-over applied comes before NOTE 2."""
    resumed = when_served(lambda: WSClient(sender.base_url, token, session=sid,
                                           last_seq=last_seq), within=30)
    try:
        sender.send_message(sid, note(2))
        resumed.recv_type("NOTE", within=10, n=2)
        return [m["payload"]["n"] for m in resumed.received if m["type"] == "NOTE"]
    finally:
        resumed.close()


def hello(node: GunicornServer, token: str) -> tuple[WSClient, str, int]:
    client = WSClient(node.base_url, token)
    client.hello()
    return client, client.session_id, int(client.received[-1]["seq"])


def test_a_delivery_heard_by_a_holder_that_dies_unread_reaches_the_next_holder(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis,
        nodes: list[GunicornServer]) -> None:
    # Before: send_message raised ClusterUnavailable ("did not confirm"), and the NOTE
    # was lost with the holder (an AG-UI handler's stream_text stopped as if the session
    # were gone: tests/agui/test_worker_kill.py's made-up TEXT_MESSAGE_END).
    a, worker = holder(private_redis, nodes)
    b = make_server(redisUrl=private_redis.url, redisPrefix=PREFIX)
    token = b.issue_token("alice")
    client, sid, seen = hello(a, token)
    try:
        os.kill(worker, signal.SIGSTOP)  # it still listens (PUBLISH reaches it), reads nothing
        b.send_message(sid, note(1))  # kept: not an error (ClusterUnavailable), not lost
        kill(a, worker)
    finally:
        client.close()
    assert notes_after_resume(b, token, sid, seen) == [1, 2]


def test_a_delivery_a_dead_holder_applied_but_did_not_confirm_arrives_once(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis,
        nodes: list[GunicornServer]) -> None:
    # The holder applies the NOTE and its journal commits it (the client may have it);
    # its confirmation fails, and it dies. The sender's copy must not reach the client a
    # second time from the next holder. Before: ClusterUnavailable (and, retried by hand,
    # the NOTE twice).
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser("holder", enabled=True, passwords=["+holder-pw"], commands=["+@all"],
                      keys=[f"{PREFIX}:[^r]*", f"{PREFIX}:r:*"], channels=["*"])
    url = f"redis://holder:holder-pw@127.0.0.1:{private_redis.port}/0"
    a, worker = holder(private_redis, nodes, url)
    b = make_server(redisUrl=private_redis.url, redisPrefix=PREFIX)
    token = b.issue_token("alice")
    client, sid, seen = hello(a, token)
    try:
        b.send_message(sid, note(1))  # after DELIVERY_WAIT: a copy queued, no error
        window = b"".join(admin.lrange(f"{PREFIX}:r:{sid}", 0, -1))
        assert window.count(b'"NOTE"') == 1, window  # the holder applied it: Redis has it
        kill(a, worker)
    finally:
        client.close()
    assert notes_after_resume(b, token, sid, seen) == [1, 2]


def test_the_ids_of_deliveries_from_other_nodes_move_with_the_state(
        make_server: Callable[..., ProtoServer], redis_url: str, prefix: str) -> None:
    # What lets the next holder skip a copy: by the time the holder confirms a delivery
    # from another node, its id is in the session's state in Redis.
    a = make_server(redisUrl=redis_url, redisPrefix=prefix)
    b = make_server(redisUrl=redis_url, redisPrefix=prefix)
    client = WSClient(a.base_url, a.issue_token("alice"))
    rdb = redis.Redis.from_url(redis_url)
    try:
        client.hello()
        sid = client.session_id
        for n in range(3):
            b.send_message(sid, note(n))
            ids = orjson.loads(rdb.hget(f"{prefix}:s:{sid}", "state") or b"{}")["delivered"]
            assert len(ids) == n + 1 and ids[-1].startswith(b.hub.node_id + ":"), ids
    finally:
        client.close()
