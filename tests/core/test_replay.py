"""The replay window (docs/PROTOCOL.md §8): bounded by count and age, ACK drops a prefix,
ranges come back in numeric seq order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from protoflask.core.replay import ReplayWindow


def filled(size=100, time_ms=10_000, seqs=range(1, 6), now=0):
    w = ReplayWindow(size, time_ms)
    for seq in seqs:
        w.add(seq, f"msg-{seq}".encode(), now)
    return w


def stored_seqs(w):
    return [e.seq for e in w]


def test_add_keeps_data_verbatim_in_seq_order():
    w = filled()
    assert stored_seqs(w) == [1, 2, 3, 4, 5]
    assert [e.data for e in w] == [f"msg-{i}".encode() for i in range(1, 6)]
    assert len(w) == 5
    assert w.first_seq == 1


def test_size_bound_drops_the_oldest():
    w = filled(size=3)
    assert stored_seqs(w) == [3, 4, 5]
    assert w.first_seq == 3
    assert w.nbytes == sum(len(f"msg-{i}".encode()) for i in (3, 4, 5))


def test_time_bound_drops_entries_older_than_the_window():
    w = ReplayWindow(100, 1000)
    w.add(1, b"a", 0)
    w.add(2, b"b", 900)
    w.add(3, b"c", 1500)       # horizon 500: seq 1 (age 1500) goes, seq 2 (age 600) stays
    assert stored_seqs(w) == [2, 3]
    w.prune(1950)              # horizon 950: seq 2 (age 1050) goes
    assert stored_seqs(w) == [3]
    w.prune(2400)              # seq 3 is 900 ms old: still kept
    assert stored_seqs(w) == [3]
    w.prune(3000)
    assert stored_seqs(w) == [] and w.first_seq is None and w.nbytes == 0


def test_ack_drops_everything_up_to_and_including_seq():
    w = filled()
    w.ack(2)
    assert stored_seqs(w) == [3, 4, 5]
    w.ack(0)                   # below the window: nothing happens
    assert stored_seqs(w) == [3, 4, 5]
    w.ack(99)
    assert stored_seqs(w) == [] and w.nbytes == 0


def test_range_is_inclusive_and_numeric():
    w = filled(seqs=range(1, 13))
    got, complete = w.range(9, 11)
    assert [e.seq for e in got] == [9, 10, 11]   # not "10", "11", "9"
    assert complete is True
    got, _ = w.range(2, 2)
    assert [e.data for e in got] == [b"msg-2"]
    got, complete = w.range(8)
    assert [e.seq for e in got] == [8, 9, 10, 11, 12] and complete


def test_range_reports_whether_the_start_is_still_held():
    w = filled(size=3, seqs=range(1, 8))          # holds 5, 6, 7
    got, complete = w.range(3)
    assert [e.seq for e in got] == [5, 6, 7]
    assert complete is False
    got, complete = w.range(5)
    assert [e.seq for e in got] == [5, 6, 7] and complete is True
    got, complete = w.range(6, 6)
    assert [e.seq for e in got] == [6] and complete is True


def test_range_on_an_empty_window_is_incomplete():
    w = ReplayWindow(10, 1000)
    assert w.range(1) == ([], False)


def test_nbytes_tracks_adds_and_drops():
    w = ReplayWindow(2, 1000)
    w.add(1, b"aaaa", 0)
    w.add(2, b"bb", 0)
    assert w.nbytes == 6
    w.add(3, b"c", 0)
    assert w.nbytes == 3
    w.ack(2)
    assert w.nbytes == 1


def test_a_small_window_is_a_list_and_a_grown_one_a_deque_with_the_same_answers():
    """Issue 29: an idle session's window (its HELLO reply, a heartbeat or two) is a list;
    past SMALL_WINDOW entries it becomes a deque. Every answer is the same either side."""
    from collections import deque

    from protoflask.core.replay import SMALL_WINDOW

    w = ReplayWindow(size=40, time_ms=1000, max_bytes=5000)
    assert type(w._entries) is list
    for seq in range(1, SMALL_WINDOW + 1):
        w.add(seq, b"x" * seq, now=seq)
    assert type(w._entries) is list and stored_seqs(w) == list(range(1, SMALL_WINDOW + 1))
    w.ack(3)  # a list drops its prefix too
    assert stored_seqs(w)[0] == 4
    for seq in range(SMALL_WINDOW + 1, 60):
        w.add(seq, b"x" * seq, now=seq)
    assert type(w._entries) is deque
    assert stored_seqs(w) == list(range(20, 60))  # the size bound: the last 40
    assert w.range(50, 52)[0][1].seq == 51 and w.holds(20) and not w.holds(19)
    w.prune(1000 + 30)  # older than 30 ms before the horizon go
    assert stored_seqs(w) == list(range(30, 60))
    assert w.nbytes == sum(range(30, 60))


# -- what every entry repeats, kept once (issue 29) ----------------------------------------

SID = "0123456789abcdef0123456789abcdef"
CAPS = b'{"flow_control":{"enabled":true},"max_concurrent_runs":10}'
TYPES = b'["ERROR","HELLO","PING"]'


def envelope(seq: int, body: bytes) -> bytes:
    return (b'{"id":"%s:%d","session":"%s","seq":"%d","payload":%s}'
            % (SID.encode(), seq, SID.encode(), seq, body))


def test_a_window_keeps_what_its_messages_repeat_once():
    """The copy kept has the session id and a HELLO reply's shared parts marked; what
    comes back, and every size, is the message as written."""
    from protoflask.core.replay import shared

    hello = envelope(1, b'{"capabilities":%s,"accept_events":%s,"session":"%s"}'
                     % (CAPS, TYPES, SID.encode()))
    ping = envelope(2, b'{"nonce":"n1"}')
    w = ReplayWindow(10, 1000, session_id=SID)
    assert w.add(1, hello, 0, shared(CAPS, TYPES)) == hello
    assert w.add(2, ping, 0) == ping
    kept = [e[2] for e in w._entries]  # the copies held
    assert len(kept[0]) == len(hello) - 3 * (len(SID) - 1) - (len(CAPS) - 1) - (len(TYPES) - 1)
    assert len(kept[1]) == len(ping) - 2 * (len(SID) - 1)
    assert [e.data for e in w] == [hello, ping]
    assert w.entry_at(0) == (1, hello) and w.range(2)[0][0].data == ping
    assert w.nbytes == len(hello) + len(ping) == w.bytes_between(1, 2)
    assert w.bytes_between(1, 1) == len(hello) and w.bytes_between(2, 9) == len(ping)
    # one segment tuple for every session's HELLO: each entry holds a pointer to it
    other = ReplayWindow(10, 1000, session_id="another-session")
    other.add(1, hello, 0, shared(CAPS, TYPES))
    assert other._entries[0][4] is w._entries[0][4]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["ping", "hello", "twice", "marks", "plain",
                                                       "other"]),
              st.binary(max_size=40)),
    st.tuples(st.just("add"), st.just("ping"), st.binary(max_size=4)),
    st.tuples(st.just("ack"), st.integers(0, 40), st.just(b"")),
    st.tuples(st.just("prune"), st.integers(0, 400), st.just(b"")),
), max_size=60), st.sampled_from([None, 3, 200, 4000]), st.sampled_from([SID, "s", "x" * 8]),
       st.sampled_from([12, 40]))
@pytest.mark.parametrize("hinted", [True, False])
def test_the_compact_window_answers_as_the_plain_one(hinted, ops, max_bytes, sid, size):
    """The swap point: a window given its session's id (compacted) and one without
    (``session_id=""``, kept as written) give the same answers to every question, for any
    messages: with the id in them or not, with a mark byte in them (kept as they came),
    a HELLO's segments or not (once, or twice: the first marked), in a small window and
    past SMALL_WINDOW (where the compacted entries stay and new ones are kept as
    written)."""
    from protoflask.core import replay

    old_hinted, replay.HINTED = replay.HINTED, hinted  # the segments' search's swap point
    try:
        compact_answers_as_plain(ops, max_bytes, sid, size)
    finally:
        replay.HINTED = old_hinted


def compact_answers_as_plain(ops, max_bytes, sid, size):
    from protoflask.core.replay import shared

    plain = ReplayWindow(size, 300, max_bytes)
    compact = ReplayWindow(size, 300, max_bytes, session_id=sid)
    seq, now = 0, 0
    for op, arg, extra in ops:
        now += 10
        if op == "add":
            seq += 1
            body = {"ping": b'{"nonce":"%s"}' % extra.hex().encode(),
                    "hello": b'{"c":%s,"t":%s,"s":"%s"}' % (CAPS, TYPES, sid.encode()),
                    "twice": b'{"t":%s,"c":%s,"d":%s,"u":%s}' % (TYPES, CAPS, CAPS, TYPES),
                    "marks": b'"%s\x00\x01%s"' % (extra, sid.encode()),
                    "plain": b"%s" % extra.hex().encode(),
                    "other": extra}[arg]
            data = envelope(seq, body).replace(SID.encode(), sid.encode())
            segments = shared(CAPS, TYPES) if arg in ("hello", "twice", "marks") else None
            assert plain.add(seq, data, now) == compact.add(seq, data, now, segments) == data
        elif op == "ack":
            plain.ack(arg)
            compact.ack(arg)
        else:
            plain.prune(arg + now - 200)
            compact.prune(arg + now - 200)
        assert list(plain) == list(compact)
        assert (len(plain), plain.nbytes, plain.first_seq, plain.last_seq, plain.oldest_at) \
            == (len(compact), compact.nbytes, compact.first_seq, compact.last_seq,
                compact.oldest_at)
        for lo in range(0, seq + 2):
            assert plain.range(lo) == compact.range(lo)
            assert plain.bytes_between(lo, lo + 2) == compact.bytes_between(lo, lo + 2)
        for i in range(len(plain)):
            assert plain.entry_at(i) == compact.entry_at(i)


def test_a_busy_window_keeps_its_new_entries_as_written():
    """Past SMALL_WINDOW entries (a busy session) the marks are not made: they would cost
    every message; the entries compacted before stay so, and every answer is the same."""
    from collections import deque

    from protoflask.core.replay import SMALL_WINDOW

    w = ReplayWindow(100, 10_000, session_id=SID)
    pings = [envelope(seq, b'{"nonce":"n%d"}' % seq) for seq in range(1, SMALL_WINDOW + 6)]
    for seq, ping in enumerate(pings, 1):
        w.add(seq, ping, 0)
    assert type(w._entries) is deque
    assert len(w._entries[0][2]) < len(pings[0])  # compacted while small
    assert w._entries[-1][2] == pings[-1]  # kept as written once busy
    assert [e.data for e in w] == pings and w.nbytes == sum(map(len, pings))
