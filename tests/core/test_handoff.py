"""A session moved to another node (core.handoff): exported as JSON-ready data, rebuilt
there from that data and its replay entries, it carries on as if it had never moved."""

from __future__ import annotations

import orjson

from protoflask.core import handoff, messages
from protoflask.core.session import ProtocolSession

from ._support import Client, make_session, seqs, types


def moved(session: ProtocolSession, now: int) -> ProtocolSession:
    """What another node rebuilds from what the old one hands over: the state through
    JSON (open texts included), the window as stored entries."""
    state = orjson.loads(orjson.dumps(handoff.export_state(session, texts=True)))
    entries = [(e.seq, e.stored_at, e.data) for e in session.replay]
    copy = handoff.restore(state, session.settings, now, entries)
    for item in orjson.loads(orjson.dumps(handoff.pending_outbound(session))):
        copy.send(messages.from_dict(item))  # queued again on the new node
    return copy


def test_a_moved_session_replays_resumes_and_keeps_its_seqs() -> None:
    s = make_session(now=1000)
    c = Client(s, now=1000)
    c.handshake(accept_events=["RUN_STARTED", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END"])
    run = s.work.start_run(1000, run_id="r1", thread_id="t", metadata={"k": 1})
    s.work.open_call("call-1", run.run_id)
    s.send_text("before the move")
    s.send(messages.create("NOTE", {"n": 0}))  # not in accept_events: filtered out
    sent = c.take()
    assert types(sent) == ["RUN_STARTED", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END"]
    s.detach(1100)

    copy = moved(s, now=1200)
    assert copy.id == s.id and copy.user_id == s.user_id
    assert copy.handshake_completed and not copy.connected
    assert copy.upstream_seq == s.upstream_seq and copy.downstream_seq == s.downstream_seq
    assert copy.accept_events == s.accept_events
    assert set(copy.runs) == {"r1"} and copy.runs["r1"].metadata == {"k": 1}
    assert set(copy.calls) == {"call-1"}

    copy.attach(1200, last_seq=seqs(sent)[0])  # resume after RUN_STARTED
    replayed = Client(copy, now=1200).take()
    assert replayed == sent[1:]
    copy.send(messages.create("NOTE", {"n": 1}))  # still filtered after the move
    copy.send_text("after the move")
    after = Client(copy, now=1200).take()
    assert seqs(after) == [s.downstream_seq + 1, s.downstream_seq + 2, s.downstream_seq + 3]
    assert after[0]["payload"]["message_id"] != sent[1]["payload"]["message_id"]
    # the client's resends of what the old node processed are still recognised
    c.s = copy
    assert c.send("PING", {"nonce": "x"}, seq=c.seq) == []
    assert types(c.take()) == []
    # a call opened on the old node can still be finished here, once
    assert copy.work.tool_done("call-1", "OK", {"v": 1}) is True
    assert copy.work.tool_done("call-1", "OK", {"v": 1}) is False


def test_acknowledged_and_expired_entries_do_not_come_back() -> None:
    s = make_session(now=0, replay_window_time=1000)
    c = Client(s)
    c.handshake()
    for n in range(4):
        s.send(messages.create("NOTE", {"n": n}))
    sent = c.take(now=0)
    s.last_ack = seqs(sent)[1]
    entries = [(e.seq, e.stored_at, e.data) for e in s.replay]
    copy = handoff.restore(handoff.export_state(s), s.settings, 500, entries)
    assert [e.seq for e in copy.replay] == seqs(sent)[2:]
    late = handoff.restore(handoff.export_state(s), s.settings, 5000, entries)
    assert len(late.replay) == 0 and late.downstream_seq == s.downstream_seq


def test_messages_waiting_for_credit_move_with_the_session() -> None:
    s = make_session(now=0, credits={"initial_credits": 1})
    c = Client(s)
    c.handshake(capabilities={"flow_control": {"downstream": True}})
    for n in range(3):
        s.send(messages.create("NOTE", {"n": n}))
    assert len(c.take()) == 1  # one credit on AGENT; two wait
    copy = moved(s, now=10)
    assert copy.credits.downstream_enabled  # the client asked, and still counts
    assert [ob.payload["n"] for ob in copy.pending] == [1, 2]
    copy.credits.add_client_credit("AGENT", 5, 0)
    assert [m["payload"]["n"] for m in Client(copy).take()] == [1, 2]


def test_upstream_seqs_not_seen_yet_move_with_the_session() -> None:
    s = make_session(now=0)
    c = Client(s)
    c.handshake()  # seq 1
    for seq in (2, 5):
        c.send("PING", {"nonce": str(seq)}, seq=seq)
    c.take()
    copy = moved(s, now=10)
    c2 = Client(copy)
    copy.attach(10)
    for seq in (5, 4, 4, 3, 2, 1):  # only 3 and 4 were never seen
        c2.send("PING", {"nonce": str(seq)}, seq=seq)
    assert [m["payload"]["nonce"] for m in c2.take()] == ["4", "3"]


def test_the_extensions_of_the_first_hello_move_with_the_session() -> None:
    s = make_session(now=1000)
    c = Client(s, now=1000)
    c.handshake(capabilities={"extensions": ["agui", "unknown-one", 7]})
    assert c.hello_reply["payload"]["capabilities"]["extensions"] == ["agui"]
    assert s.extensions == {"agui"}
    c.send("HELLO", {"proto_version": "1.1.2", "accept_major": [1],
                     "capabilities": {"extensions": []}})  # a later HELLO changes nothing
    assert s.extensions == {"agui"}
    assert moved(s, now=1100).extensions == {"agui"}
    plain = make_session(now=1000)
    Client(plain, now=1000).handshake()
    assert plain.extensions == frozenset() and moved(plain, now=1100).extensions == frozenset()


def test_open_texts_move_with_the_session_and_end_there_whole_and_charged() -> None:
    # The old node accepted the START and the first PARTs (their seqs are seen: the
    # client does not send them again); the END and a last PART reach the new node.
    s = make_session(now=0, echo_messages=True, max_text_size=64)
    c = Client(s)
    c.handshake()
    c.send("MESSAGE_START", {"message_id": "m1", "content_type": "text/markdown"})
    c.send("MESSAGE_PART", {"message_id": "m1", "content": "héllo "})
    c.send("MESSAGE_PART", {"message_id": "m1", "content": "wörld "})
    c.send("MESSAGE_START", {"message_id": "m2", "content_type": "text/plain"})
    c.take()
    held = s.meter.held
    assert held > 0

    copy = moved(s, now=10)
    assert set(copy.texts) == {"m1", "m2"}
    assert copy.texts["m1"].size == s.texts["m1"].size
    assert copy.meter.held > 0  # what the parts cost is charged here too
    copy.attach(10)
    c.s = copy
    c.send("MESSAGE_PART", {"message_id": "m1", "content": "again"})
    c.send("MESSAGE_END", {"message_id": "m1"})
    c.send("MESSAGE_END", {"message_id": "m2"})
    echoed = [m for m in c.take() if m["type"] == "MESSAGE_PART"]
    assert "".join(m["payload"]["content"] for m in echoed) == "héllo wörld again"
    assert copy.texts == {} and copy.meter.held == 0  # all given back as they ended
    # maxTextSize still counts the parts the old node took
    c.send("MESSAGE_START", {"message_id": "m3", "content_type": "text/plain"})
    c.send("MESSAGE_PART", {"message_id": "m3", "content": "x" * 60})
    third = moved(copy, now=20)
    third.attach(20)
    c.s = third
    c.take()
    c.send("MESSAGE_PART", {"message_id": "m3", "content": "y" * 5})
    assert [m["payload"]["code"] for m in c.take() if m["type"] == "ERROR"] == \
        ["MESSAGE_TOO_LARGE"]


def test_open_texts_are_exported_only_for_a_hand_over() -> None:
    # a cluster's every journal batch writes the state: a text in it would be written
    # again with each of its parts (up to maxTextSize each time)
    s = make_session(now=0)
    c = Client(s)
    c.handshake()
    assert "texts" not in handoff.export_state(s, texts=True)
    c.send("MESSAGE_START", {"message_id": "m", "content_type": "text/plain"})
    c.send("MESSAGE_PART", {"message_id": "m", "content": "so far"})
    assert "texts" not in handoff.export_state(s)
    assert handoff.export_state(s, texts=True)["texts"] == [["m", "text/plain", "so far", 6]]
