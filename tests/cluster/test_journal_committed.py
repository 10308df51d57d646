"""A replay of messages Redis already has goes to the wire without waiting for a batch
(``Journal.append`` with ``committed_only``): the cursor's ``committed_seq`` moves only
once a flush wrote the session's entries, never for a session the script left alone,
and a replay with one message Redis does not have yet still waits for its batch."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

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
    epoch = 0


def _linked(j: Journal, sid: str) -> tuple[LiveSession, Cursor]:
    live = LiveSession(ProtocolSession(sid, "u", ServerConfig().session_settings(), 0))
    cursor = Cursor()
    live.link = cursor  # type: ignore[assignment]  # what committed_to reads
    j.redis.hset(j.keys.session(sid), mapping={"node": NODE, "epoch": 0})
    return live, cursor


def _wait(ran: list[Any], n: int) -> None:
    with gevent.Timeout(5):
        while len(ran) < n:
            gevent.sleep(0.005)


def _msgs(*seqs: int) -> list[tuple[int, bytes]]:
    return [(s, b'{"m":%d}' % s) for s in seqs]


def scenario(redis_url: str, prefix: str) -> tuple[list[Any], list[int], int, list[bool]]:
    """Three messages written, then replayed twice (all of them; with a fourth)."""
    j = Journal(connect(redis_url), Keys(prefix), NODE, 10, 60_000, lambda _: None,
                lambda *_: None)
    live, cursor = _linked(j, "s1")
    ran: list[Any] = []
    at_once: list[bool] = []
    j.start()
    try:
        j.append(live, cursor, _msgs(1, 2, 3), 1000, then=lambda: ran.append("first"))
        _wait(ran, 1)
        for label, ready in (("replay", _msgs(1, 2, 3)), ("replay+1", _msgs(2, 3, 4))):
            n = len(ran)
            j.append(live, cursor, ready, 1000, then=lambda label=label: ran.append(label))
            at_once.append(len(ran) > n)
            _wait(ran, n + 1)
        listed = [unpack_entry(e)[0] for e in j.redis.lrange(j.keys.replay("s1"), 0, -1)]
    finally:
        j.stop()
    return ran, listed, cursor.committed_seq, at_once


def test_a_replay_of_committed_messages_goes_at_once(redis_url: str, prefix: str) -> None:
    ran, listed, committed, at_once = scenario(redis_url, prefix)
    assert ran == ["first", "replay", "replay+1"]
    assert at_once == [True, False]  # the replay with seq 4 waited for its batch
    assert listed == [1, 2, 3, 4] and committed == 4


def test_the_fast_path_changes_nothing_but_when(redis_url: str, prefix: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fast = scenario(redis_url, prefix + "fast:")
    monkeypatch.setattr(journal_module, "committed_only", lambda ready, seq: False)
    slow = scenario(redis_url, prefix + "slow:")
    assert fast[:3] == slow[:3]
    assert slow[3] == [False, False]


def test_a_fenced_session_commits_nothing(redis_url: str, prefix: str) -> None:
    j = Journal(connect(redis_url), Keys(prefix), NODE, 10, 60_000, lambda _: None,
                lambda *_: None)
    live, cursor = _linked(j, "s2")
    j.redis.hset(j.keys.session("s2"), mapping={"node": "node-b"})  # taken over
    ran: list[Any] = []
    j.start()
    try:
        j.append(live, cursor, _msgs(1, 2), 1000, then=lambda: ran.append(1))
        _wait(ran, 1)
        assert cursor.committed_seq == 0
        j.append(live, cursor, _msgs(1, 2), 1000, then=lambda: ran.append(2))
        assert ran == [1]  # not at once: Redis does not have them
        _wait(ran, 2)
    finally:
        j.stop()
