"""A session handed over (a drain, a resume elsewhere) reaches its client without a hole,
however slowly Redis takes the journal's writes meanwhile: the closing transport writes
its messages in seq order (a client skips any seq below the last it had), and the state
a node leaves for the next holder is never ahead of the window it wrote.

Node a reaches the real redis-server through a link the test slows down
(``RedisLink``): a's journal batches wait in it while the hand-over goes on."""

from __future__ import annotations

import threading
from typing import Callable, Iterator

import pytest

from protoflask import ProtoServer

from ..support import (PrivateRedis, SSEClient, StreamEnded, WSClient, hanging_tool, timeout,
                       wait_for)
from .link import RedisLink
from .notes import note
from .retry import status_of, when_served


@pytest.fixture
def link(private_redis: PrivateRedis) -> Iterator[RedisLink]:
    link = RedisLink(private_redis.port)
    try:
        yield link
    finally:
        link.close()


def read_to_end(client: SSEClient) -> None:
    try:
        while True:
            client.recv(within=15)
    except StreamEnded:
        pass


def test_a_drain_writes_the_cancelled_calls_done_before_anything_later(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis,
        link: RedisLink) -> None:
    """The drain cancels a running call: its TOOL_DONE is taken as the SSE stream closes,
    which waits for the journal; a message sent meanwhile must not reach the client
    first. Before, the response's greenlet wrote it (a later seq) while the closing
    greenlet's TOOL_DONE went into a list the response had already swapped out: the
    client never saw the TOOL_DONE, and a resume from its last seq did not replay it
    (the soak's drain rows: one seq lost and the call stranded, on SSE)."""
    a = make_server(redisUrl=link.url)
    b = make_server(redisUrl=private_redis.url)
    started = hanging_tool(a)

    token = a.issue_token("alice")
    client = SSEClient(a.base_url, token)
    resumed: SSEClient | None = None
    stopping = threading.Thread(target=a.stop, daemon=True)
    try:
        client.hello()
        sid = client.session_id
        assert sid is not None
        client.send("TOOL_CALL", payload={"call_id": "s1", "tool": "slow", "params": {}})
        assert started.wait(timeout(5))

        link.hold(b"EVALSHA")  # a's journal writes wait from here
        stopping.start()  # the drain: s1 cancelled, the stream closing with its TOOL_DONE
        link.wait_holding(b"CANCELLED", "the TOOL_DONE's journal write")
        a.send_message(sid, note(1))  # while the closing stream waits for the journal
        a.get_session(sid)  # (a turn of a's hub: its writers have seen the note)
        link.release()
        read_to_end(client)
        stopping.join(timeout(15))

        seen = [m for m in client.received if "seq" in m]
        last = int(seen[-1]["seq"])
        resumed = SSEClient(b.base_url, token, session=sid, last_seq=last)
        resumed.envelopes = client.envelopes
        everything = seen
        if not any(m["type"] == "NOTE" for m in seen):
            everything = seen + [resumed.recv_type("NOTE")]
        if not any(m["type"] == "TOOL_DONE" for m in everything):
            everything += [resumed.recv_type("TOOL_DONE", within=5, call_id="s1")]
        done = [m for m in everything if m["type"] == "TOOL_DONE"]
        assert [d["payload"]["status"] for d in done] == ["CANCELLED"]
        seqs = [int(m["seq"]) for m in everything]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    finally:
        link.release()
        client.close()
        if resumed is not None:
            resumed.close()


def test_a_resume_elsewhere_takes_over_only_once_the_holders_journal_has_written_all(
        make_server: Callable[..., ProtoServer], private_redis: PrivateRedis,
        link: RedisLink) -> None:
    """A message a stamped for a detached session is on its way to Redis (its journal
    write held in the link) when the client resumes on b. Before, a let the session go at
    once: its state, naming that seq, reached Redis first, b numbered on from it, the
    late batch was fenced off, and the client never got the message (no ERROR either).
    Now a writes what its journal holds first (b's resume gets 503 meanwhile, retried)."""
    a = make_server(redisUrl=link.url)
    b = make_server(redisUrl=private_redis.url)
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    resumed: WSClient | None = None
    try:
        client.hello()
        sid = client.session_id
        a.send_message(sid, note(0))
        seen = int(client.recv_type("NOTE")["seq"])
        client.drop()
        wait_for(lambda: (a.get_session(sid) or {}).get("connected") is False,
                 what="a to see the client gone")

        link.hold(b"EVALSHA")
        a.send_message(sid, note(1))  # into the window; its journal write waits in the link
        link.wait_holding(b'"n":1', "note 1's journal write")
        try:
            resumed = WSClient(b.base_url, token, session=sid, last_seq=seen)
        except Exception as exc:  # noqa: BLE001 - a 503 while a writes its journal
            assert status_of(exc) == 503, exc
        link.release()
        if resumed is None:
            resumed = when_served(lambda: WSClient(b.base_url, token, session=sid,
                                                   last_seq=seen), within=15)
        assert resumed.recv_type("NOTE")["payload"]["n"] == 1
        assert int(resumed.received[-1]["seq"]) == seen + 1
    finally:
        link.release()
        client.close()
        if resumed is not None:
            resumed.close()
