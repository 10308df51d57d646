"""A worker's Redis pool opens as many connections as its greenlets have commands
waiting: a storm of handshakes, each waiting on a command while the beat, the listener
and the journal hold theirs, must not find the pool "full" (redis-py 6 and later cap a
pool at 100 when told None: MaxConnectionsError, a ConnectionError, and the node took
itself for cut off from Redis)."""

from __future__ import annotations

import uuid

import gevent

from protoflask.cluster.redis_client import connect


def test_more_commands_waiting_at_once_than_redis_pys_default_cap(redis_url: str) -> None:
    client = connect(redis_url)
    key = f"pftest-pool-{uuid.uuid4().hex[:10]}"  # nothing is ever pushed there
    try:
        waiting = [gevent.spawn(client.blpop, [key], 0.5) for _ in range(150)]
        gevent.joinall(waiting, timeout=30)
        failed = [g.exception for g in waiting if g.exception is not None]
        assert not failed, failed[:3]
        assert all(g.value is None for g in waiting)  # each waited out its BLPOP
    finally:
        client.connection_pool.disconnect()
