"""The journal's short way through its one command (the EVALSHA packed by
``redis_client.pack`` and written on the flusher's own connection) answers exactly as
redis-py's way: the same bytes on the wire, the same reply, the same keys in Redis, the
same error replies; and a lost connection falls back to redis-py's way, which
reconnects."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.connection
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import NoScriptError

from protoflask.cluster.journal import APPEND_SCRIPT, Journal
from protoflask.cluster.keys import Keys, pack_entry
from protoflask.cluster.redis_client import GeventConnection, connect, int_array, pack

NODE = "node-a"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_pack_writes_what_redis_py_writes(args: list[bytes]) -> None:
    # (redis-py splits a first argument with a space into words: the journal's is EVALSHA)
    packer = redis.connection.PythonRespSerializer(
        6000, redis.connection.Encoder("utf-8", "strict", False).encode)
    assert pack([b"EVALSHA", *args]) == b"".join(packer.pack(b"EVALSHA", *args))


def journal(url: str, prefix: str) -> Journal:
    def failed(exc: BaseException) -> None:
        raise AssertionError(f"unexpected failure {exc!r}")

    def fenced(*_: Any) -> None:
        raise AssertionError("unexpected fence")

    return Journal(connect(url), Keys(prefix), NODE, 5, 60_000, failed, fenced)


def script_args(j: Journal, sids: list[str], seqs: range, epoch: int = 1,
                first: int = 0) -> list[bytes]:
    keys: list[bytes] = []
    blobs: list[bytes] = []
    for sid in sids:
        keys += (j.keys.replay(sid).encode(), j.keys.session(sid).encode())
        state = b'{"v":1,"sid":"%b"}' % sid.encode()
        entries = (pack_entry(s, 1000 + s, b'{"m":%d}' % s) for s in seqs)
        blobs.append(b"\n".join((b"%d %d" % (epoch, first), state, *entries)))
    assert j._sha is not None
    return [b"EVALSHA", j._sha.encode(), b"%d" % len(keys), *keys, b"5", b"60000",
            NODE.encode(), *blobs]


def stored(r: redis.Redis, j: Journal, sids: list[str]) -> list[Any]:
    return [(r.lrange(j.keys.replay(sid), 0, -1), r.hgetall(j.keys.session(sid)))
            for sid in sids]


def test_the_short_way_answers_as_redis_py_does(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    j = journal(redis_url, prefix)
    j._sha = j.redis.script_load(APPEND_SCRIPT)
    ways = {}
    for way in ("short", "redis-py"):
        # held here, held by another node (fenced), no record (gone)
        sids = [f"{way}-held", f"{way}-other", f"{way}-gone"]
        r.hset(j.keys.session(sids[0]), mapping={"node": NODE, "epoch": 1})
        r.hset(j.keys.session(sids[1]), "node", "node-b")
        j._conn_busy = way == "redis-py"  # busy: the second flush goes redis-py's way
        first = j._evalsha(script_args(j, sids, range(1, 9)))
        again = j._evalsha(script_args(j, sids, range(6, 12)))  # 6..8 already there
        j._conn_busy = False
        ways[way] = (first, again, stored(r, j, sids))
    assert isinstance(j._conn, GeventConnection)  # the short way was taken
    short, slow = ways["short"], ways["redis-py"]
    assert short[:2] == slow[:2] == ([2, -3], [2, -3])
    assert [(lst, {k: v.replace(b"short", b"redis-py") for k, v in h.items()})
            for lst, h in short[2]] == slow[2]
    assert short[2][0][0] == [pack_entry(s, 1000 + s, b'{"m":%d}' % s) for s in range(7, 12)]


def test_a_write_at_an_older_epoch_is_fenced_off(redis_url: str, prefix: str) -> None:
    # the same node, holding the session again since (another node had it between):
    # what it journaled for its earlier hold must not land
    r = redis.Redis.from_url(redis_url)
    j = journal(redis_url, prefix)
    j._sha = j.redis.script_load(APPEND_SCRIPT)
    r.hset(j.keys.session("s"), mapping={"node": NODE, "epoch": 3})
    assert j._evalsha(script_args(j, ["s"], range(1, 3), epoch=2)) == [1]
    assert r.llen(j.keys.replay("s")) == 0 and r.hget(j.keys.session("s"), "state") is None
    assert j._evalsha(script_args(j, ["s"], range(1, 3), epoch=3)) == []
    assert r.llen(j.keys.replay("s")) == 2


def test_the_window_in_redis_keeps_what_the_window_in_memory_keeps(redis_url: str,
                                                                   prefix: str) -> None:
    # first_seq: the oldest seq the in-memory window holds (after replayWindowBytes,
    # replayWindowTime and ACKs); what is older leaves Redis too
    r = redis.Redis.from_url(redis_url)
    j = journal(redis_url, prefix)  # (at most 5 entries by count)
    j._sha = j.redis.script_load(APPEND_SCRIPT)
    r.hset(j.keys.session("s"), mapping={"node": NODE, "epoch": 1})
    j._evalsha(script_args(j, ["s"], range(1, 5), first=1))
    assert [int(e.split(b" ")[0]) for e in r.lrange(j.keys.replay("s"), 0, -1)] == [1, 2, 3, 4]
    j._evalsha(script_args(j, ["s"], range(5, 6), first=4))  # 1-3 acked or aged out
    assert [int(e.split(b" ")[0]) for e in r.lrange(j.keys.replay("s"), 0, -1)] == [4, 5]


def test_an_error_reply_raises_on_the_short_way(redis_url: str, prefix: str) -> None:
    j = journal(redis_url, prefix)
    j._sha = "0" * 40  # no such script: NOSCRIPT, which flush answers by loading it
    with pytest.raises(NoScriptError):
        j._evalsha(script_args(j, ["s"], range(1, 2)))
    assert j._conn is not None and j._conn._sock is not None  # still usable
    j._sha = j.redis.script_load(APPEND_SCRIPT)
    j.redis.hset(j.keys.session("s"), mapping={"node": NODE, "epoch": 1})
    assert j._evalsha(script_args(j, ["s"], range(1, 2))) == []


def test_a_lost_connection_goes_the_long_way_and_reconnects(redis_url: str,
                                                            prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    j = journal(redis_url, prefix)
    j._sha = j.redis.script_load(APPEND_SCRIPT)
    r.hset(j.keys.session("s"), mapping={"node": NODE, "epoch": 1})
    assert j._evalsha(script_args(j, ["s"], range(1, 3))) == []
    conn = j._conn
    assert conn is not None
    conn.send_command("CLIENT", "ID")
    r.client_kill_filter(_id=conn.read_response())
    assert j._evalsha(script_args(j, ["s"], range(3, 5))) == []  # the long way
    assert j._evalsha(script_args(j, ["s"], range(5, 7))) == []  # the short way again
    assert j._conn is conn and conn._sock is not None
    assert r.lrange(j.keys.replay("s"), 0, -1) == [
        pack_entry(s, 1000 + s, b'{"m":%d}' % s) for s in range(2, 7)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-10**6, 10**6), max_size=30), st.data())
def test_an_int_array_is_read_whole_from_any_cut(values: list[int], data: Any) -> None:
    raw = b"*%d\r\n" % len(values) + b"".join(b":%d\r\n" % v for v in values)
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert int_array(raw[:cut]) is None
    assert int_array(raw) == values


def test_an_error_reply_is_its_text_and_another_shape_is_a_lost_connection() -> None:
    assert int_array(b"-NOSCRIPT No matching script.\r\n") == "NOSCRIPT No matching script."
    assert int_array(b"-ERR x") is None
    for raw in (b"+OK\r\n", b"$3\r\nabc\r\n", b"*1\r\n$1\r\na\r\n", b"*-1\r\n",
                b"*1\r\n:1\r\n:2\r\n", b"_\r\n", b":5\r\n", b"*1\r\n:x\r\n"):
        with pytest.raises(redis.ConnectionError):
            int_array(raw)


def test_the_batch_command_is_packed_as_pack_packs_its_arguments(redis_url: str,
                                                                  prefix: str) -> None:
    from ..hub.test_local_hub import live_session

    j = journal(redis_url, prefix)
    sessions = [live_session(f"s{i}") for i in range(3)]
    for n in range(1, 4):  # the keys kept packed from the first batch on
        batch = {live.id: (live, [pack_entry(s, 1000, b'{"m":%d}' % s) for s in range(n)])
                 for live in sessions[:n]}
        args, packed = j._command(batch, "0" * 40)
        assert packed == pack(args)
        assert args[3:3 + 2 * n] == [k for live in sessions[:n] for k in (
            j.keys.replay(live.id).encode(), j.keys.session(live.id).encode())]
    j.window_size = 7  # (the constant arguments packed again when they change)
    args, packed = j._command(batch, "1" * 40)
    assert packed == pack(args) and b"7" in args
