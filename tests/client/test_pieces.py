"""The client's sans-I/O pieces on plain data, no server: the upstream queue (seqs,
credit through the core's ledger, confirmation, refusals) and the downstream half."""

from __future__ import annotations

import orjson

from protoflask.client._downstream import Downstream, Text
from protoflask.client._upstream import CAUTIOUS_START, Entry, UpstreamQueue
from protoflask.core.envelope import parse
from protoflask.core.seen import SeenSeqs


def queue_with_credit(messages: int, nbytes: int) -> UpstreamQueue:
    up = UpstreamQueue("t")
    up.on_first_hello({"enabled": True, "initial_credit_messages": messages,
                       "initial_credit_bytes": nbytes})
    return up


def text(up: UpstreamQueue, content: str) -> Entry:
    entry = Entry("MESSAGE_PART", "USER", {"message_id": "m", "content": content},
                  up.next_id())
    up.data.append(entry)
    return entry


def test_envelopes_are_what_the_server_parses():
    up = queue_with_credit(10, 10000)
    text(up, "hello")
    [entry] = up.take_batch("s1", confirms_on_send=True, now_ms=1234, monotonic=0.0)
    msg = parse(entry.data)
    assert (msg.id, msg.session, msg.seq, msg.ts, msg.type, msg.channel) == (
        "t-1", "s1", 1, 1234, "MESSAGE_PART", "USER")
    assert list(orjson.loads(entry.data)) == ["id", "session", "seq", "ts", "type",
                                              "channel", "payload"]


def test_data_waits_for_message_credit_and_control_does_not():
    up = queue_with_credit(2, 10000)
    for n in range(3):
        text(up, f"t{n}")
    up.control_message("PONG", {"nonce": "x"})
    batch = up.take_batch("s", confirms_on_send=True, now_ms=0, monotonic=0.0)
    assert [e.type for e in batch] == ["PONG", "MESSAGE_PART", "MESSAGE_PART"]
    assert [e.seq for e in batch] == [1, 2, 3] and len(up.data) == 1
    up.on_flow_update({"channel": "USER", "add_messages": 1, "add_bytes": 0})
    assert [e.seq for e in up.take_batch("s", True, 0, 0.0)] == [4]


def test_byte_credit_counts_the_encoded_envelope():
    up = queue_with_credit(10, 150)
    text(up, "x" * 10)
    text(up, "y" * 10)
    [first] = up.take_batch("s", True, 0, 0.0)
    assert len(first.data) <= 150 < 2 * len(first.data) and len(up.data) == 1


def test_a_resent_message_is_refunded_and_goes_first():
    up = queue_with_credit(1, 10000)
    sent = text(up, "a")
    up.take_batch("s", confirms_on_send=False, now_ms=0, monotonic=0.0)
    assert up.unconfirmed[0] is sent
    up.on_hello(last_client_seq=0)  # the server never saw it
    assert list(up.data) == [sent] and not up.unconfirmed
    [again] = up.take_batch("s", False, 0, 0.0)  # the refund pays for the resend
    # under its own seq: if the first copy still reaches the server (a POST cut off by
    # the reset, arriving after the HELLO), one of the two is dropped as a retransmission
    assert again is sent and again.seq == 1


def test_a_resend_after_a_late_hello_reply_keeps_its_seq_so_it_runs_once():
    # The HELLO reply said the server had seen up to seq 1; the call (seq 2) reached it
    # afterwards. Sent again under seq 2, the server's SeenSeqs drops it: one run.
    up = queue_with_credit(5, 10000)
    first, call = text(up, "a"), text(up, "call")
    up.take_batch("s", confirms_on_send=True, now_ms=0, monotonic=0.0)
    hello = up.hello({}, "s", 0)  # the next connection's HELLO: seq 3
    up.on_hello(last_client_seq=first.seq)
    [again] = up.take_batch("s", True, 0, 0.0)
    assert again is call and again.seq == 2 < hello.seq
    server = SeenSeqs(0)  # what the session counts as seen, as the server keeps it
    assert all(server.first_time(seq) for seq in (first.seq, hello.seq, call.seq))
    assert not server.first_time(again.seq)  # the resend: a retransmission, dropped
    # Cut off again before its 202: the next HELLO reply says 3 (that HELLO), which
    # does not cover a resend below it: it goes once more, still under seq 2.
    up.hello({}, "s", 0)
    up.on_hello(last_client_seq=hello.seq)
    assert up.take_batch("s", True, 0, 0.0) == [call] and call.seq == 2


def test_channel_paused_refusal_holds_the_message_until_resume():
    up = queue_with_credit(5, 10000)
    refused = text(up, "a")
    up.take_batch("s", False, 0, 0.0)
    assert up.on_refusal("CHANNEL_PAUSED", refused.id)
    assert up.retry == [refused] and "USER" in up.paused
    assert up.cautious["USER"] == [CAUTIOUS_START, 0, 0]
    assert up.take_batch("s", False, 0, 0.0) == []
    up.on_resume("USER")
    assert up.take_batch("s", False, 0, 0.0)[0] is refused
    assert not up.on_refusal("TOOL_NOT_FOUND", refused.id)


def test_downstream_drops_what_it_delivered_and_grants_when_half_is_spent():
    down = Downstream(credit_messages=4, credit_bytes=1000)
    assert down.deliver(1) and not down.deliver(1) and down.deliver(3)
    assert down.spend("AGENT", 10) is None
    assert down.spend("AGENT", 10) == {"channel": "AGENT", "add_messages": 2,
                                       "add_bytes": 20}
    assert down.ack() == {"seq": "3"} and not down.unacked


def test_texts_are_assembled():
    down = Downstream(10, 1000)
    parts: list[tuple[str, str]] = []
    assert down.on_text("MESSAGE_START", {"message_id": "m", "content_type": "text/plain"},
                        "AGENT", None) is True
    for piece in ("he", "llo"):
        down.on_text("MESSAGE_PART", {"message_id": "m", "content": piece}, "AGENT",
                     lambda mid, c: parts.append((mid, c)))
    assert down.on_text("MESSAGE_END", {"message_id": "m"}, "AGENT", None) == Text(
        "m", "hello", "text/plain", "AGENT")
    assert parts == [("m", "he"), ("m", "llo")]
    assert down.on_text("MESSAGE_END", {"message_id": "other"}, "AGENT", None) is False
