"""A journal writer that does not wait (``Journal.append(..., then=...)``): its
continuation runs once Redis has the batch, exactly once, and never before."""

from __future__ import annotations

from typing import Any

import gevent

from protoflask.cluster import journal as journal_module
from protoflask.cluster.journal import Journal
from protoflask.cluster.keys import Keys, unpack_entry
from protoflask.cluster.redis_client import connect
from protoflask.config import ServerConfig
from protoflask.core.session import ProtocolSession
from protoflask.live import LiveSession

NODE = "node-a"


class Cursor:
    journaled_seq = 0
    committed_seq = 0


def test_then_runs_once_redis_has_the_batch(redis_url: str, prefix: str) -> None:
    failures: list[BaseException] = []
    j = Journal(connect(redis_url), Keys(prefix), NODE, 10, 60_000, failures.append,
                lambda *_: None)
    r = j.redis
    live = LiveSession(ProtocolSession("s1", "u", ServerConfig().session_settings(), 0))
    r.hset(j.keys.session("s1"), mapping={"node": NODE, "epoch": 0})  # no link: epoch 0
    seen: list[list[int]] = []
    j.start()
    try:
        for seq in (1, 2, 3):
            j.append(live, Cursor(), [(seq, b'{"m":%d}' % seq)], 1000,
                     then=lambda: seen.append(
                         [unpack_entry(e)[0] for e in r.lrange(j.keys.replay("s1"), 0, -1)]))
        assert seen == []  # returned at once: nothing written yet
        deadline = gevent.Timeout(5)
        with deadline:
            while len(seen) < 3:
                gevent.sleep(0.01)
    finally:
        j.stop()
    assert seen == [[1, 2, 3]] * 3  # each ran once, every entry already in Redis
    assert failures == []


def test_a_batch_released_twice_runs_each_continuation_once() -> None:
    ran: list[int] = []
    thens: list[Any] = [lambda: ran.append(1), lambda: ran.append(2)]
    committed = gevent.event.Event()
    journal_module._release(committed, thens)  # the give-up timer
    journal_module._release(committed, thens)  # then the flush, late
    assert ran == [1, 2] and committed.is_set()


def test_a_paused_journal_runs_then_at_once(redis_url: str, prefix: str) -> None:
    j = Journal(connect(redis_url), Keys(prefix), NODE, 10, 60_000, lambda _: None,
                lambda *_: None)
    j.paused = True
    live = LiveSession(ProtocolSession("s2", "u", ServerConfig().session_settings(), 0))
    ran: list[bool] = []
    j.append(live, Cursor(), [(1, b"{}")], 1000, then=lambda: ran.append(True))
    assert ran == [True]
