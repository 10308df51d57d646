"""What one session can make the server hold, and what its errors cost (core, no sockets):
replays merged and written in batches, the replay window bounded by bytes, open texts
and their size, the pending queue (control messages included), echoes within
maxMessageSize, bounded validation errors, and ERRORs charged to the rate limit."""

from __future__ import annotations

import json

import orjson

from protoflask.core import messages
from protoflask.core.errors import InvalidMessage
from protoflask.core.replay import ReplayWindow, ResendQueue
from protoflask.core.outbound import REPLAY_BATCH_BYTES
from protoflask.core.session import SendRefused, SlowConsumer

from ._support import Client, errors, make_session, types


def produce_texts(c: Client, n: int, size: int) -> None:
    """n echoed texts of ``size`` characters, all taken (so the window holds 3n + 1)."""
    for i in range(n):
        c.send("MESSAGE_START", {"message_id": f"t{i}", "content_type": "text/plain"})
        c.send("MESSAGE_PART", {"message_id": f"t{i}", "content": "x" * size})
        c.send("MESSAGE_END", {"message_id": f"t{i}"})
    c.take()


def drain(c: Client) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while c.s.has_writable():
        batch = c.take_raw()
        assert batch
        out += batch
    return out


# -- REPLAY_REQUEST: merged, incremental, counted ---------------------------------------------


def test_repeated_replay_requests_resend_the_window_once():
    s = make_session()
    c = Client(s)
    c.handshake()
    produce_texts(c, 10, 100)
    last = s.downstream_seq
    for _ in range(50):
        c.send("REPLAY_REQUEST", {"from_seq": "1"}, channel="SYSTEM")
    out = drain(c)
    assert [seq for seq, _ in out] == list(range(1, last + 1))  # each once, in order


def test_overlapping_replay_ranges_merge_in_numeric_order():
    q = ResendQueue()
    w = ReplayWindow(100, 10**9)
    for seq in range(1, 21):
        w.add(seq, b"%d" % seq, 0)
    for lo, hi in ((5, 8), (1, 3), (7, 12), (4, 4), (15, 15), (14, 16)):
        q.add(lo, hi)
    assert [seq for seq, _ in q.take(w, 10**6)] == list(range(1, 13)) + [14, 15, 16]
    assert not q


def test_a_replay_is_written_in_bounded_batches_and_counts_as_unsent():
    s = make_session(max_message_size=1 << 20)
    c = Client(s)
    c.handshake()
    produce_texts(c, 20, 50_000)  # about 1 MB in the window
    window = s.replay.nbytes
    c.send("REPLAY_REQUEST", {"from_seq": "1"}, channel="SYSTEM")
    assert s.unsent_bytes >= window  # resent bytes count toward the outbound buffer
    first = c.take_raw()
    assert sum(len(d) for _, d in first) <= REPLAY_BATCH_BYTES + 60_000
    assert s.unsent_bytes <= window - sum(len(d) for _, d in first) + 1
    rest = drain(c)
    assert [q for q, _ in first + rest] == list(range(1, s.downstream_seq + 1))
    assert s.unsent_bytes == 0


def test_newer_messages_wait_until_the_replay_is_written():
    s = make_session()
    c = Client(s)
    c.handshake()
    produce_texts(c, 30, 20_000)
    c.send("REPLAY_REQUEST", {"from_seq": "1"}, channel="SYSTEM")
    c.send("PING", {"nonce": "after"}, channel="SYSTEM")
    seqs = [q for q, _ in drain(c)]
    assert seqs == sorted(seqs) and seqs[-1] == s.downstream_seq  # the PONG comes last


def test_a_client_that_never_reads_its_replays_is_a_slow_consumer():
    s = make_session(outbound_buffer_size=65536)
    c = Client(s)
    c.handshake()
    produce_texts(c, 10, 10_000)  # 100 kB window
    s.set_in_flight(30_000)  # a write is blocked: the client does not read
    events = c.send("REPLAY_REQUEST", {"from_seq": "1"}, channel="SYSTEM")
    assert any(isinstance(e, SlowConsumer) for e in events)


# -- the replay window by bytes --------------------------------------------------------------


def test_the_window_is_bounded_by_bytes_and_keeps_the_newest():
    w = ReplayWindow(1000, 10**9, max_bytes=5000)
    for seq in range(1, 21):
        w.add(seq, b"x" * 1000, 0)
    assert w.nbytes <= 5000 and w.first_seq == 16 and w.last_seq == 20
    w.add(21, b"y" * 9000, 0)  # larger than the budget: kept alone
    assert len(w) == 1 and w.first_seq == 21


def test_a_resume_past_the_byte_bound_is_replay_unavailable():
    s = make_session(replay_window_bytes=20_000)
    c = Client(s)
    c.handshake()
    produce_texts(c, 10, 5_000)
    s.detach(0)
    s.attach(0, last_seq=1)
    out = [json.loads(d) for _, d in drain(c)]
    assert sum(len(orjson.dumps(m)) for m in out[:-1]) <= 20_000 + 6_000
    assert errors(out) == ["REPLAY_UNAVAILABLE"]
    assert int(out[-1]["payload"]["detail"]["first_available"]) == s.replay.first_seq


# -- texts -----------------------------------------------------------------------------------


def test_open_texts_are_capped():
    s = make_session(max_open_texts=3)
    c = Client(s)
    c.handshake()
    for i in range(4):
        c.send("MESSAGE_START", {"message_id": f"o{i}", "content_type": "text/plain"})
    out = c.take()
    assert errors(out) == ["INVALID_MESSAGE"] and "maxOpenTexts 3" in out[-1]["payload"]["message"]
    assert len(s.texts) == 3


def test_a_text_over_max_text_size_is_discarded_counting_utf8_bytes():
    s = make_session(max_text_size=1000)
    c = Client(s)
    c.handshake()
    c.send("MESSAGE_START", {"message_id": "big", "content_type": "text/plain"})
    c.send("MESSAGE_PART", {"message_id": "big", "content": "é" * 400})  # 800 bytes
    assert errors(c.take()) == []
    c.send("MESSAGE_PART", {"message_id": "big", "content": "é" * 101})  # 1002 bytes
    out = c.take()
    assert errors(out) == ["MESSAGE_TOO_LARGE"] and "maxTextSize" in out[-1]["payload"]["message"]
    c.send("MESSAGE_END", {"message_id": "big"})
    assert errors(c.take()) == ["INVALID_MESSAGE"]  # the text was discarded


def test_an_echo_is_split_so_no_envelope_exceeds_max_message_size():
    s = make_session(max_message_size=4096)
    c = Client(s)
    c.handshake()
    text = ("abc\u00e9\u4e2d\U0001f600\n\x01\"" * 700)  # escapes and multibyte
    c.send("MESSAGE_START", {"message_id": "t", "content_type": "text/plain"})
    for i in range(0, len(text), 500):
        c.send("MESSAGE_PART", {"message_id": "t", "content": text[i:i + 500]})
    c.send("MESSAGE_END", {"message_id": "t"})
    raw = c.take_raw()
    assert max(len(d) for _, d in raw) <= 4096
    parts = [json.loads(d) for _, d in raw]
    echo = [m for m in parts if m["type"] == "MESSAGE_PART" and m["channel"] == "AGENT"]
    assert len(echo) > 1 and "".join(m["payload"]["content"] for m in echo) == text


def test_split_text_keeps_short_text_whole():
    assert messages.split_text("m", "hello", 1000) == ["hello"]
    assert messages.split_text("m", "", 1000) == [""]


# -- the pending queue -------------------------------------------------------------------------


def test_control_messages_at_the_pending_cap_make_a_slow_consumer_and_are_kept():
    s = make_session(max_pending_messages=5)
    c = Client(s)
    c.handshake()
    events = []
    for i in range(3):  # PONGs queued while no write is blocked: nothing to say
        events += c.send("PING", {"nonce": f"q{i}"}, channel="SYSTEM")
    assert not any(isinstance(e, SlowConsumer) for e in events)
    s.set_in_flight(1000)  # a write is blocked
    for i in range(8):  # PONGs nobody takes: the client is not reading
        events += c.send("PING", {"nonce": f"p{i}"}, channel="SYSTEM")
    assert sum(isinstance(e, SlowConsumer) for e in events) == 1
    assert types(c.take()).count("PONG") == 11  # nothing dropped


def test_data_messages_at_the_pending_byte_cap_are_refused_and_reported():
    # the cap: max(outboundBufferSize, 4 * maxMessageSize)
    s = make_session(outbound_buffer_size=10_000, max_message_size=2_000,
                     credits={"initial_credits": 1})
    c = Client(s)
    c.handshake(capabilities={"flow_control": {"downstream": True, "initial_credit_messages": 1}})
    c.take()
    for i in range(20):  # no credit: they wait in pending
        s.send(messages.text_part(f"m{i}", "z" * 1000))
    refused = [e for e in s.take_events() if isinstance(e, SendRefused)]
    assert refused and s.outbound.pending_bytes <= 10_000 + 1200


# -- bounded error work -----------------------------------------------------------------------


def test_a_hello_with_250k_bad_elements_gets_a_small_error():
    s = make_session()
    c = Client(s)
    c.send("HELLO", {"proto_version": "1.1.2", "accept_major": [""] * 250_000})
    raw = c.take_raw()
    assert len(raw) == 1 and len(raw[0][1]) < 4096
    detail = json.loads(raw[0][1])["payload"]["detail"]["accept_major"]
    assert len(detail) == 6 and "250000 elements" in detail["more"]


def test_error_detail_is_truncated():
    big = InvalidMessage("x", detail={"k": "v" * 10_000})
    payload = messages.error(big).payload
    assert payload["detail"]["truncated"] is True
    assert len(orjson.dumps(payload["detail"])) <= messages.MAX_DETAIL_BYTES + 100
    long = messages.error(InvalidMessage("m" * 5000)).payload["message"]
    assert len(long) == messages.MAX_ERROR_MESSAGE and long.endswith("...")


def test_every_error_costs_a_rate_limit_token():
    s = make_session(rate_limit=1.0, rate_limit_burst=10)
    c = Client(s)
    c.handshake()  # one token
    for _ in range(6):  # each: a token to receive, one for its ERROR
        c.send("NO_SUCH_TYPE", {}, channel="SYSTEM")
    assert "RATE_LIMITED" in errors(c.take())
