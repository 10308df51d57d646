"""The message counters sessions share (what /metrics reads): by type in and out, with
bounded labels, and replays by source and result."""

from __future__ import annotations

from protoflask.core import messages
from protoflask.core.session import ProtocolSession
from protoflask.core.traffic import TrafficCounters

from ._support import Client, receive_events, session_settings


def moved(counts: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in counts.items() if v != before.get(k, 0)}


def test_sessions_sharing_counters_add_up_by_type():
    traffic = TrafficCounters()
    a = Client(ProtocolSession("a", "u", session_settings(), 0, traffic))
    b = Client(ProtocolSession("b", "u", session_settings(), 0, traffic))
    for c in (a, b):
        c.s.attach(0)
        c.handshake()
    a.send("PING", {"nonce": "1"})
    b.send("PING", {"nonce": "2"})
    a.take()
    b.take()
    assert traffic.received["HELLO"] == 2 and traffic.received["PING"] == 2
    assert traffic.sent["HELLO"] == 2 and traffic.sent["PONG"] == 2


def test_unknown_types_and_unreadable_envelopes_get_one_label_each():
    c = Client(ProtocolSession("a", "u", session_settings(), 0))
    c.s.attach(0)
    traffic = c.s.traffic
    before = dict(traffic.received)
    c.send("MADE_UP_1", {})
    c.send("MADE_UP_2", {})
    receive_events(c.s, b"not json", 0)
    receive_events(c.s, b'{"type": "PING"}', 0)
    assert moved(traffic.received, before) == {"unknown": 2, "invalid": 2}
    assert set(traffic.received) >= {"unknown", "invalid"}
    assert "MADE_UP_1" not in traffic.received


def test_a_message_is_counted_sent_once_when_it_gets_its_seq_not_when_queued():
    c = Client(ProtocolSession("a", "u", session_settings(), 0))
    c.s.attach(0)
    c.handshake(capabilities={"flow_control": {"initial_credit_messages": 1,
                                               "downstream": True}})
    c.s.send(messages.text_start("m1"))
    c.s.send(messages.text_end("m1"))
    c.s.send(messages.from_dict({"type": "APP_EVENT", "channel": "AGENT", "payload": {}}))
    c.take()
    sent = c.s.traffic.sent
    assert sent["MESSAGE_START"] == 1 and sent["MESSAGE_END"] == 0  # END waits for credit
    assert "APP_EVENT" not in sent
    c.send("FLOW_UPDATE", {"channel": "AGENT", "add_messages": 5, "add_bytes": 0})
    c.take()
    assert sent["MESSAGE_END"] == 1 and sent["APP_EVENT"] == 1


def test_replays_by_source_and_result():
    s = ProtocolSession("a", "u", session_settings(replay_window_size=2), 0)
    c = Client(s)
    s.attach(0)
    c.handshake()
    for i in range(3):
        c.send("PING", {"nonce": str(i)})
    c.take()  # downstream seqs 1..4; the window keeps 3 and 4
    replays = s.traffic.replays
    s.detach(0)
    s.attach(0, last_seq=2)  # resume: 3 and 4 are there
    c.take()  # replayed messages count as they are written
    assert replays["resume", "complete"] == 1 and s.traffic.replayed_messages == 2
    s.detach(0)
    s.attach(0, last_seq=4)  # nothing was sent after 4: complete, nothing replayed
    assert replays["resume", "complete"] == 2 and s.traffic.replayed_messages == 2
    c.send("REPLAY_REQUEST", {"from_seq": "1"})
    c.take()
    assert replays["request", "unavailable"] == 1
    assert s.traffic.replayed_messages == 4
    assert replays["resume", "unavailable"] == replays["request", "complete"] == 0
