"""ProtocolSession flows (docs/PROTOCOL.md §2, §4, §6, §8), driven with plain data and ms ints."""

from __future__ import annotations

import json

import pytest

from protoflask.core.handoff import snapshot
from protoflask.core import errors, messages
from protoflask.core.session import (
    CloseRequested, ErrorSent, Expired, Handshake, HeartbeatTimedOut, ProtocolSession, Run,
    RunChanged, TextReceived, ToolCallReceived, ToolCancelRequested, ToolListRequested,
)

from ._support import (
    Client, errors as error_codes, hello_payload, make_session, raw, receive_decoded_events,
    receive_events, seqs, session_settings, tick_events, types,
)

#: The server-to-client types docs/PROTOCOL.md §4 lists.
CONTRACT_SERVER_TYPES = {
    "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_UPDATE",
    "TOOL_DONE", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "FLOW_UPDATE", "PAUSE_CHANNEL",
    "RESUME_CHANNEL", "ERROR",
}


def of_type(events, cls):
    return [e for e in events if isinstance(e, cls)]


# -- handshake ----------------------------------------------------------------------------------


def test_hello_reply_fields():
    s = make_session(max_concurrent_runs=3, replay_window_size=77, replay_window_time=4321,
                     heartbeat_interval=1234, max_message_size=5555,
                     credits={"initial_credit_messages": 11, "initial_credit_bytes": 2222})
    c = Client(s, now=1700000000500)
    events = c.send("HELLO", hello_payload(), id="hello-1")
    out = c.take()

    assert s.handshake_completed is True
    assert [type(e) for e in events] == [Handshake]
    assert events[0].payload["proto_version"] == "1.1.2"
    assert types(out) == ["HELLO"]
    reply = out[0]
    assert reply["channel"] == "SYSTEM"
    assert reply["session"] == "sess-1"
    assert reply["seq"] == "1"
    assert reply["ts"] == "1700000000500"
    assert isinstance(reply["id"], str) and reply["id"] and reply["id"] != "hello-1"
    p = reply["payload"]
    assert p["proto_version"] == "1.1.2"
    assert p["accept_major"] == [1]
    assert p["session"] == "sess-1"
    assert p["last_client_seq"] == "0"
    assert CONTRACT_SERVER_TYPES <= set(p["accept_events"])
    caps = p["capabilities"]
    assert caps["flow_control"]["initial_credit_messages"] == 11
    assert caps["flow_control"]["initial_credit_bytes"] == 2222
    assert caps["max_concurrent_runs"] == 3
    assert caps["replay_window"] == {"size": 77, "time_ms": 4321}
    assert caps["heartbeat_interval_ms"] == 1234
    assert caps["max_message_size"] == 5555
    assert caps["rate_limit"] == {"messages_per_second": 1000.0, "burst": 2000}
    assert caps["max_json_depth"] == 64


def test_last_client_seq_is_the_highest_seq_seen_before_the_hello():
    s = make_session()
    c = Client(s)
    c.send("PING", {"nonce": "a"}, seq=3)
    c.send("PING", {"nonce": "b"}, seq=7)
    c.take()
    c.send("HELLO", hello_payload(), seq=9)
    (reply,) = c.take()
    assert reply["payload"]["last_client_seq"] == "7"


def test_second_hello_is_answered_again_without_a_second_handshake_event(client):
    client.send("PING", {"nonce": "x"})
    client.take()
    events = client.send("HELLO", hello_payload())  # seq 3
    (reply,) = client.take()
    assert reply["type"] == "HELLO"
    assert reply["payload"]["last_client_seq"] == "2"
    assert of_type(events, Handshake) == []
    assert client.s.handshake_completed


@pytest.mark.parametrize("majors", [[2], [], [0, 3]])
def test_unsupported_major_is_error_then_close_4001(majors):
    s = make_session()
    c = Client(s)
    events = c.send("HELLO", hello_payload(accept_major=majors), id="h-bad")
    out = c.take()
    assert types(out) == ["ERROR"]
    assert out[0]["channel"] == "SYSTEM"
    assert out[0]["payload"]["code"] == "UNSUPPORTED_VERSION"
    assert out[0]["payload"]["related_id"] == "h-bad"
    closes = of_type(events, CloseRequested)
    assert [c.code for c in closes] == [4001]
    assert of_type(events, Handshake) == []
    assert s.handshake_completed is False


def test_accept_major_containing_1_among_others_is_accepted():
    s = make_session()
    c = Client(s)
    events = c.send("HELLO", hello_payload(accept_major=[2, 1]))
    assert of_type(events, Handshake) and s.handshake_completed
    assert types(c.take()) == ["HELLO"]


NON_HANDSHAKE_MESSAGES = [
    ("PONG", {"nonce": "n"}),
    ("MESSAGE_START", {"message_id": "m", "content_type": "text/plain"}),
    ("MESSAGE_PART", {"message_id": "m", "content": "x"}),
    ("MESSAGE_END", {"message_id": "m"}),
    ("TOOL_CALL", {"call_id": "c", "tool": "echo", "params": {}}),
    ("TOOL_CANCEL", {"call_id": "c"}),
    ("TOOL_LIST", {}),
    ("RUN_STARTED", {}),
    ("RUN_FINISHED", {"run_id": "r"}),
    ("RUN_CANCEL", {"run_id": "r"}),
    ("ACK", {"seq": "1"}),
    ("FLOW_UPDATE", {"channel": "USER", "add_messages": 1}),
    ("PAUSE_CHANNEL", {"channel": "AGENT"}),
    ("RESUME_CHANNEL", {"channel": "AGENT"}),
    ("REPLAY_REQUEST", {"from_seq": "1"}),
    ("AUDIO_CHUNK", {"message_id": "a", "mime": "audio/wav", "data": "AA=="}),
]


@pytest.mark.parametrize("mtype,payload", NON_HANDSHAKE_MESSAGES,
                         ids=[t for t, _ in NON_HANDSHAKE_MESSAGES])
def test_everything_but_hello_and_ping_needs_the_handshake(mtype, payload):
    s = make_session()
    c = Client(s)
    events = c.send(mtype, payload, id="early")
    out = c.take()
    assert error_codes(out) == ["HANDSHAKE_REQUIRED"]
    assert types(out) == ["ERROR"]
    assert out[0]["payload"]["related_id"] == "early"
    assert [type(e) for e in events] == [ErrorSent]
    assert s.runs == {} and s.calls == {} and s.texts == {}


def test_ping_is_answered_before_the_handshake():
    s = make_session()
    c = Client(s)
    assert c.send("PING", {"nonce": "pre"}) == []
    out = c.take()
    assert types(out) == ["PONG"]
    assert out[0]["payload"] == {"nonce": "pre"}
    assert out[0]["channel"] == "SYSTEM"
    assert s.handshake_completed is False


def test_handshake_required_rejection_still_advances_the_seq():
    s = make_session()
    c = Client(s)
    c.send("TOOL_LIST", {}, seq=1)
    assert error_codes(c.take()) == ["HANDSHAKE_REQUIRED"]
    # A HELLO reusing seq 1 is a retransmission and is dropped silently.
    assert c.send("HELLO", hello_payload(), seq=1) == []
    assert c.take() == []
    assert s.handshake_completed is False
    c.send("HELLO", hello_payload(), seq=2)
    assert types(c.take()) == ["HELLO"]


def test_client_announced_capabilities_set_downstream_credit():
    s = make_session()
    c = Client(s)
    c.handshake(capabilities={"flow_control": {"initial_credit_messages": 2,
                                               "downstream": True}})
    for i in range(4):
        s.send(messages.text_part("m", str(i)))
    assert [m["payload"]["content"] for m in c.take()] == ["0", "1"]


@pytest.mark.parametrize("flow_control", [
    {"initial_credit_messages": 2},  # the reference SDK: announces, never tops up
    {"initial_credit_messages": 2, "downstream": False},
    {"initial_credit_messages": 2, "downstream": "true"},  # only the JSON true asks
    None,
])
def test_a_client_that_does_not_ask_for_downstream_credit_is_never_stalled(flow_control):
    s = make_session()
    c = Client(s)
    c.handshake(capabilities={} if flow_control is None else {"flow_control": flow_control})
    for i in range(2000):
        s.send(messages.text_part("m", str(i)))
    assert len([m for m in c.take() if m["type"] == "MESSAGE_PART"]) == 2000
    assert snapshot(s)["downstreamCredits"] == {}


# -- upstream seq ------------------------------------------------------------------------------


def test_resend_with_seq_not_greater_than_last_is_dropped_silently(client):
    assert client.send("PING", {"nonce": "a"}, seq=2) == []
    assert types(client.take()) == ["PONG"]
    for seq in (2, 1):
        assert client.send("PING", {"nonce": "again"}, seq=seq) == []
        assert client.take() == []
    assert client.s.upstream_seq == 2


def test_gaps_are_allowed_and_a_seq_in_a_gap_is_processed_once(client):
    # docs/PROTOCOL.md §2.2: below the highest, only a seq already seen is a resend.
    client.send("PING", {"nonce": "a"}, seq=10)
    assert [m["payload"]["nonce"] for m in client.take()] == ["a"]
    client.send("PING", {"nonce": "b"}, seq=5)
    assert [m["payload"]["nonce"] for m in client.take()] == ["b"]
    client.send("PING", {"nonce": "b again"}, seq=5)
    assert client.take() == []
    client.send("PING", {"nonce": "c"}, seq=11)
    assert [m["payload"]["nonce"] for m in client.take()] == ["c"]
    assert snapshot(client.s)["lastClientSeq"] == "11"


def test_out_of_order_tool_calls_are_each_processed_once():
    # 50 TOOL_CALLs arriving shuffled (concurrent POSTs), then all of them again.
    import random

    s = make_session()
    c = Client(s)
    c.handshake()
    seqs_ = list(range(2, 52))
    random.Random(14).shuffle(seqs_)
    calls = []
    for seq in seqs_ + seqs_:
        events = c.send("TOOL_CALL", {"call_id": f"c{seq}", "tool": "t", "params": {}},
                        seq=seq)
        calls += [e.call_id for e in events if isinstance(e, ToolCallReceived)]
    assert sorted(calls) == sorted(f"c{seq}" for seq in seqs_)
    assert error_codes(c.take()) == []
    assert s.upstream_seq == 51


@pytest.mark.parametrize("mtype,payload,code", [
    ("MESSAGE_PART", {"message_id": "nope", "content": "x"}, "INVALID_MESSAGE"),
    ("BOGUS_TYPE", {}, "UNSUPPORTED_TYPE"),
    ("PING", {}, "INVALID_MESSAGE"),
    ("RUN_FINISHED", {}, "MISSING_RUN_ID"),
    ("RUN_CANCEL", {"run_id": "ghost"}, "RUN_NOT_FOUND"),
])
def test_rejected_messages_still_advance_the_seq(client, mtype, payload, code):
    client.send(mtype, payload, seq=5, channel="USER")
    assert error_codes(client.take()) == [code]
    assert client.s.upstream_seq == 5
    # The same seq again is a retransmission, whatever it carries.
    assert client.send("PING", {"nonce": "dup"}, seq=5) == []
    assert client.take() == []


def test_invalid_envelope_does_not_advance_the_seq(client):
    bad = json.dumps({"id": "x", "session": "sess-1", "seq": "50", "ts": "1", "type": "PING",
                      "channel": "NOWHERE", "payload": {"nonce": "n"}})
    events = receive_events(client.s, bad, 0)
    assert [type(e) for e in events] == [ErrorSent]
    assert error_codes(client.take()) == ["INVALID_MESSAGE"]
    assert client.s.upstream_seq == 1
    client.send("PING", {"nonce": "ok"}, seq=2)
    assert types(client.take()) == ["PONG"]


@pytest.mark.parametrize("frame", [b"garbage", b"[1,2]", b'"str"', b"{}"])
def test_malformed_frames_get_invalid_message_and_the_session_goes_on(client, frame):
    receive_events(client.s, frame, 0)
    out = client.take()
    assert error_codes(out) == ["INVALID_MESSAGE"]
    assert "related_id" not in out[0]["payload"]
    client.send("PING", {"nonce": "still-here"})
    assert types(client.take()) == ["PONG"]


def test_oversize_frame_is_message_too_large_and_close_1009():
    s = make_session(max_message_size=200)
    c = Client(s)
    c.handshake()
    frame = raw("PING", {"nonce": "z" * 300}, seq="2")
    events = receive_events(s, frame, 0)
    assert [e.code for e in of_type(events, CloseRequested)] == [1009]
    assert error_codes(c.take()) == ["MESSAGE_TOO_LARGE"]
    assert s.upstream_seq == 1


def test_receive_decoded_applies_the_same_rules(client):
    env = {"id": "d-1", "session": "sess-1", "seq": "2", "ts": "1", "type": "PING",
           "channel": "SYSTEM", "payload": {"nonce": "dec"}}
    receive_decoded_events(client.s, env, 90, 0)
    assert [m["payload"] for m in client.take()] == [{"nonce": "dec"}]
    receive_decoded_events(client.s, env, 90, 0)  # same seq: dropped
    assert client.take() == []
    receive_decoded_events(client.s, ["not", "an", "object"], 10, 0)
    assert error_codes(client.take()) == ["INVALID_MESSAGE"]


# -- downstream seq ------------------------------------------------------------------------------


def test_downstream_seq_starts_at_1_and_rises_by_1_across_writes(client):
    # client fixture already took the HELLO reply, seq 1
    assert client.hello_reply["seq"] == "1"
    all_out = []
    for i in range(3):
        client.send("PING", {"nonce": str(i)})
        client.send("MESSAGE_END", {"message_id": "unknown"})  # an ERROR each
        all_out += client.take()
    client.s.send(messages.create("TOOL_UPDATE", {"call_id": "x", "status": "RUNNING"}))
    all_out += client.take()
    assert seqs(all_out) == list(range(2, 2 + len(all_out)))
    assert len(all_out) == 7
    ids = [m["id"] for m in all_out] + [client.hello_reply["id"]]
    assert len(set(ids)) == len(ids)
    assert all(m["session"] == "sess-1" for m in all_out)
    assert snapshot(client.s)["lastDeliveredSeq"] == "8"


def test_seq_and_ts_are_stamped_when_the_message_is_written(client):
    client.s.send(messages.ping("p"))
    assert client.s.downstream_seq == 1  # queued, not yet numbered
    (m,) = client.take(now=777)
    assert (m["seq"], m["ts"]) == ("2", "777")


def test_send_after_close_is_refused(client):
    client.s.close()
    assert client.s.send(messages.ping("x")) is False
    assert client.take() == []


# -- accept_events ------------------------------------------------------------------------------


def test_accept_events_filters_and_filtered_messages_take_no_seq():
    s = make_session(heartbeat_interval=1000)
    c = Client(s)
    c.handshake(accept_events=["TOOL_DONE"])
    assert c.hello_reply["seq"] == "1"
    c.send("PING", {"nonce": "x"})                        # PONG filtered out
    assert c.take() == []
    c.send("MESSAGE_END", {"message_id": "nope"})         # ERROR always passes
    assert s.send(messages.text_part("m", "x")) is False  # filtered
    assert s.send(messages.tool_done("c", "OK")) is True
    tick_events(s, 1000)                                    # heartbeat PING always passes
    out = c.take(now=1000)
    assert types(out) == ["ERROR", "TOOL_DONE", "PING"]
    assert seqs(out) == [2, 3, 4]


def test_accept_events_reply_lists_what_the_session_will_receive():
    s = make_session()
    c = Client(s)
    c.handshake(accept_events=["PONG", "NOT_A_TYPE"])
    listed = set(c.hello_reply["payload"]["accept_events"])
    assert {"PONG", "HELLO", "ERROR", "PING"} <= listed
    assert "NOT_A_TYPE" not in listed
    assert "MESSAGE_START" not in listed


def test_accept_events_unknown_names_are_ignored():
    s = make_session()
    c = Client(s)
    c.handshake(accept_events=["PONG", "NOT_A_TYPE"])
    c.send("PING", {"nonce": "n"})
    assert types(c.take()) == ["PONG"]
    assert s.send(messages.text_start("m")) is False


@pytest.mark.parametrize("hello", [{"accept_events": []}, {}])
def test_empty_or_absent_accept_events_means_all(hello):
    s = make_session()
    c = Client(s)
    c.send("HELLO", {"proto_version": "1.1.2", "accept_major": [1], **hello})
    c.take()
    for t in ("MESSAGE_START", "TOOL_UPDATE", "RUN_FINISHED", "FLOW_UPDATE"):
        assert s.send(messages.create(t, {})) is True
    assert types(c.take()) == ["MESSAGE_START", "TOOL_UPDATE", "RUN_FINISHED", "FLOW_UPDATE"]


# -- text ----------------------------------------------------------------------------------------


def test_text_assembly_events_and_echo(client):
    events = []
    events += client.send("MESSAGE_START", {"message_id": "t1", "content_type": "text/markdown"})
    events += client.send("MESSAGE_PART", {"message_id": "t1", "content": "Hello, "})
    events += client.send("MESSAGE_PART", {"message_id": "t1", "content": "world"})
    assert client.take() == []  # nothing is echoed before END
    events += client.send("MESSAGE_END", {"message_id": "t1"}, id="end-1")
    texts = of_type(events, TextReceived)
    assert len(events) == len(texts) == 4
    assert [t.message["type"] for t in texts] == [
        "MESSAGE_START", "MESSAGE_PART", "MESSAGE_PART", "MESSAGE_END"]
    assert all(t.message["payload"]["message_id"] == "t1" for t in texts)
    end = texts[-1].message
    assert end["id"] == "end-1"
    assert end["payload"]["text"] == "Hello, world"
    assert end["payload"]["content_type"] == "text/markdown"
    assert "text" not in texts[1].message["payload"]

    out = client.take()
    assert types(out) == ["MESSAGE_START", "MESSAGE_PART", "MESSAGE_END"]
    assert {m["channel"] for m in out} == {"AGENT"}
    echo_ids = {m["payload"]["message_id"] for m in out}
    assert len(echo_ids) == 1 and "t1" not in echo_ids
    assert out[0]["payload"]["content_type"] == "text/markdown"
    assert "".join(m["payload"]["content"] for m in out if m["type"] == "MESSAGE_PART") \
        == "Hello, world"
    assert client.s.texts == {}


def test_text_without_parts_is_empty(client):
    client.send("MESSAGE_START", {"message_id": "e", "content_type": "text/plain"})
    (end,) = of_type(client.send("MESSAGE_END", {"message_id": "e"}), TextReceived)
    assert end.message["payload"]["text"] == ""


def test_two_texts_interleaved_are_assembled_separately(client):
    client.send("MESSAGE_START", {"message_id": "a", "content_type": "text/plain"})
    client.send("MESSAGE_START", {"message_id": "b", "content_type": "text/html"})
    client.send("MESSAGE_PART", {"message_id": "a", "content": "A1"})
    client.send("MESSAGE_PART", {"message_id": "b", "content": "B1"})
    client.send("MESSAGE_PART", {"message_id": "a", "content": "A2"})
    (b_end,) = client.send("MESSAGE_END", {"message_id": "b"})
    (a_end,) = client.send("MESSAGE_END", {"message_id": "a"})
    assert (a_end.message["payload"]["text"], a_end.message["payload"]["content_type"]) == (
        "A1A2", "text/plain")
    assert (b_end.message["payload"]["text"], b_end.message["payload"]["content_type"]) == (
        "B1", "text/html")


def test_echo_can_be_turned_off():
    s = make_session(echo_messages=False)
    c = Client(s)
    c.handshake()
    c.send("MESSAGE_START", {"message_id": "t", "content_type": "text/plain"})
    c.send("MESSAGE_PART", {"message_id": "t", "content": "hi"})
    events = c.send("MESSAGE_END", {"message_id": "t"})
    assert of_type(events, TextReceived)[0].message["payload"]["text"] == "hi"
    assert c.take() == []


@pytest.mark.parametrize("mtype,payload", [
    ("MESSAGE_PART", {"message_id": "ghost", "content": "x"}),
    ("MESSAGE_END", {"message_id": "ghost"}),
])
def test_part_or_end_for_unknown_message_id_is_invalid_message(client, mtype, payload):
    events = client.send(mtype, payload, id="ghost-msg")
    out = client.take()
    assert types(out) == ["ERROR"]
    assert out[0]["payload"]["code"] == "INVALID_MESSAGE"
    assert out[0]["payload"]["related_id"] == "ghost-msg"
    assert of_type(events, TextReceived) == []


def test_part_after_end_is_invalid_message(client):
    client.send("MESSAGE_START", {"message_id": "t", "content_type": "text/plain"})
    client.send("MESSAGE_END", {"message_id": "t"})
    client.take()
    client.send("MESSAGE_PART", {"message_id": "t", "content": "late"})
    assert error_codes(client.take()) == ["INVALID_MESSAGE"]


def test_send_text_returns_fresh_ids(session):
    a = session.send_text("one")
    b = session.send_text("two")
    assert a != b


# -- tool calls ---------------------------------------------------------------------------------


def call(client, call_id="c1", tool="echo", params=None, run_id=None, **kw):
    payload = {"call_id": call_id, "tool": tool, "params": params or {"message": "hi"}}
    if run_id is not None:
        payload["run_id"] = run_id
    return client.send("TOOL_CALL", payload, **kw)


def test_tool_call_event_update_and_single_done(client):
    events = call(client, "c1", "add", {"a": 2, "b": 3}, id="call-msg")
    (ev,) = events
    assert isinstance(ev, ToolCallReceived)
    assert (ev.call_id, ev.tool, ev.params, ev.run_id) == ("c1", "add", {"a": 2, "b": 3}, None)
    assert ev.message["id"] == "call-msg" and ev.message["type"] == "TOOL_CALL"
    assert client.take() == []

    assert client.s.work.tool_update("c1", "RUNNING", 50) is True
    assert client.s.work.tool_done("c1", "OK", {"result": 5}) is True
    assert client.s.work.tool_done("c1", "OK", {"result": 5}) is False
    assert client.s.work.tool_done("c1", "ERROR") is False
    assert client.s.work.tool_update("c1", "RUNNING", 90) is False
    out = client.take()
    assert types(out) == ["TOOL_UPDATE", "TOOL_DONE"]
    assert {m["channel"] for m in out} == {"AGENT"}
    assert out[0]["payload"] == {"call_id": "c1", "status": "RUNNING", "progress": 50}
    assert out[1]["payload"] == {"call_id": "c1", "status": "OK", "result": {"result": 5}}


def test_duplicate_call_id_gets_only_an_error_and_the_running_call_keeps_one_done(client):
    call(client, "c1")
    events = call(client, "c1", id="dup-msg")
    assert of_type(events, ToolCallReceived) == []
    out = client.take()
    assert types(out) == ["ERROR"]
    assert out[0]["payload"]["code"] == "DUPLICATE_CALL_ID"
    assert out[0]["payload"]["related_id"] == "dup-msg"
    client.s.work.tool_done("c1", "OK", "r")
    client.s.work.tool_done("c1", "OK", "r")
    assert [m["payload"]["call_id"] for m in client.take() if m["type"] == "TOOL_DONE"] == ["c1"]
    # Finished: the call_id may be used again.
    assert of_type(call(client, "c1"), ToolCallReceived)


def test_fail_call_sends_tool_done_error_then_error(client):
    call(client, "c9", tool="nope", id="the-call")
    assert client.s.work.fail_call("c9", errors.ToolNotFound("no tool 'nope'")) is True
    out = client.take()
    assert types(out) == ["TOOL_DONE", "ERROR"]
    done, err = out
    assert done["payload"]["call_id"] == "c9"
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"] == {"code": "TOOL_NOT_FOUND", "message": "no tool 'nope'"}
    assert err["payload"]["code"] == "TOOL_NOT_FOUND"
    assert err["payload"]["related_id"] == "the-call"
    assert client.s.work.fail_call("c9", errors.ToolExecutionError()) is False
    assert client.s.work.tool_done("c9", "OK") is False
    assert client.take() == []


def test_tool_call_with_unknown_run_id_ends_with_tool_done_error_and_run_not_found(client):
    events = call(client, "c1", run_id="no-such-run", id="cm")
    assert of_type(events, ToolCallReceived) == []
    assert [e.error.code for e in of_type(events, ErrorSent)] == ["RUN_NOT_FOUND"]
    out = client.take()
    assert types(out) == ["TOOL_DONE", "ERROR"]
    assert out[0]["payload"]["status"] == "ERROR"
    assert out[0]["payload"]["error"]["code"] == "RUN_NOT_FOUND"
    assert out[1]["payload"]["code"] == "RUN_NOT_FOUND"
    assert out[1]["payload"]["related_id"] == "cm"
    assert "c1" not in client.s.calls


def test_tool_call_in_an_active_run(client):
    client.send("RUN_STARTED", {"run_id": "r1"})
    (ev,) = call(client, "c1", run_id="r1")
    assert isinstance(ev, ToolCallReceived) and ev.run_id == "r1"


def test_tool_cancel_and_tool_list_events(client):
    call(client, "c1")
    assert client.send("TOOL_CANCEL", {"call_id": "c1"}) == [ToolCancelRequested("c1")]
    assert client.send("TOOL_CANCEL", {"call_id": "unknown"}) == []
    assert client.send("TOOL_LIST", {}) == [ToolListRequested()]
    assert error_codes(client.take()) == []


def test_tool_update_progress_is_clamped_and_statuses_checked(client):
    call(client, "c1")
    client.s.work.tool_update("c1", "QUEUED")
    client.s.work.tool_update("c1", "RUNNING", 150)
    client.s.work.tool_update("c1", "RUNNING", -5, partial={"k": 1})
    out = client.take()
    assert [m["payload"].get("progress") for m in out] == [None, 100, 0]
    assert out[2]["payload"]["partial"] == {"k": 1}
    with pytest.raises(ValueError):
        client.s.work.tool_update("c1", "DONE")
    with pytest.raises(ValueError):
        client.s.work.tool_done("c1", "FINISHED")


# -- runs ----------------------------------------------------------------------------------------


def test_run_start_and_finish(client):
    client.now = 100
    events = client.send("RUN_STARTED", {"run_id": "r1", "thread_id": "t1",
                                         "metadata": {"m": 1}})
    (ev,) = events
    assert isinstance(ev, RunChanged) and ev.kind == "started"
    assert (ev.run.run_id, ev.run.thread_id, ev.run.status, ev.run.start_time,
            ev.run.metadata) == ("r1", "t1", "active", 100, {"m": 1})
    (started,) = client.take()
    assert (started["type"], started["channel"]) == ("RUN_STARTED", "AGENT")
    assert started["payload"] == {"run_id": "r1", "thread_id": "t1"}
    assert snapshot(client.s)["activeRuns"] == {"r1"}

    client.now = 250
    (ev,) = client.send("RUN_FINISHED", {"run_id": "r1", "summary": {"ok": True}})
    assert ev.kind == "finished"
    assert (ev.run.status, ev.run.end_time, ev.run.summary) == ("finished", 250, {"ok": True})
    (fin,) = client.take()
    assert (fin["type"], fin["channel"]) == ("RUN_FINISHED", "AGENT")
    assert fin["payload"] == {"run_id": "r1", "status": "finished", "summary": {"ok": True}}
    assert snapshot(client.s)["activeRuns"] == set()


def test_run_started_without_run_id_gets_a_server_id(client):
    (ev,) = client.send("RUN_STARTED", {})
    assert isinstance(ev.run.run_id, str) and ev.run.run_id
    (ev2,) = client.send("RUN_STARTED", {})
    assert ev2.run.run_id != ev.run.run_id
    out = client.take()
    assert [m["payload"]["run_id"] for m in out] == [ev.run.run_id, ev2.run.run_id]


def test_max_runs_exceeded():
    s = make_session(max_concurrent_runs=2)
    c = Client(s)
    c.handshake()
    c.send("RUN_STARTED", {"run_id": "a"})
    c.send("RUN_STARTED", {"run_id": "b"})
    events = c.send("RUN_STARTED", {"run_id": "c"}, id="third")
    out = c.take()
    assert types(out) == ["RUN_STARTED", "RUN_STARTED", "ERROR"]
    assert out[2]["payload"]["code"] == "MAX_RUNS_EXCEEDED"
    assert out[2]["payload"]["related_id"] == "third"
    assert of_type(events, RunChanged) == []
    assert set(s.runs) == {"a", "b"}
    c.send("RUN_FINISHED", {"run_id": "a"})
    c.send("RUN_STARTED", {"run_id": "c"})
    assert types(c.take()) == ["RUN_FINISHED", "RUN_STARTED"]
    assert set(s.runs) == {"b", "c"}
    with pytest.raises(errors.MaxRunsExceeded):
        s.work.start_run(0)


@pytest.mark.parametrize("mtype", ["RUN_FINISHED", "RUN_CANCEL"])
def test_finishing_or_cancelling_unknown_run_is_run_not_found(client, mtype):
    client.send(mtype, {"run_id": "ghost"}, id="rm")
    out = client.take()
    assert types(out) == ["ERROR"]
    assert out[0]["payload"]["code"] == "RUN_NOT_FOUND"
    assert out[0]["payload"]["related_id"] == "rm"


@pytest.mark.parametrize("mtype", ["RUN_FINISHED", "RUN_CANCEL"])
def test_run_id_required_is_missing_run_id(client, mtype):
    client.send(mtype, {}, id="rm")
    out = client.take()
    assert [(m["payload"]["code"], m["payload"]["related_id"]) for m in out] == [
        ("MISSING_RUN_ID", "rm")]


def test_a_run_finishes_once(client):
    client.send("RUN_STARTED", {"run_id": "r1"})
    client.send("RUN_FINISHED", {"run_id": "r1"})
    client.send("RUN_CANCEL", {"run_id": "r1"})
    assert types(client.take()) == ["RUN_STARTED", "RUN_FINISHED", "ERROR"]


def test_run_of_another_session_is_not_found():
    a, b = Client(make_session()), Client(make_session())
    a.handshake()
    b.handshake()
    a.send("RUN_STARTED", {"run_id": "shared"})
    b.send("RUN_FINISHED", {"run_id": "shared"})
    assert error_codes(b.take()) == ["RUN_NOT_FOUND"]


def test_cancel_run_lists_its_calls(client):
    client.send("RUN_STARTED", {"run_id": "r1"})
    client.send("RUN_STARTED", {"run_id": "r2"})
    call(client, "c1", run_id="r1")
    call(client, "c2", run_id="r2")
    call(client, "c3", run_id="r1")
    call(client, "c4")
    client.take()
    client.now = 99
    (ev,) = client.send("RUN_CANCEL", {"run_id": "r1"})
    assert ev.kind == "cancelled"
    assert sorted(ev.cancelled_calls) == ["c1", "c3"]
    assert (ev.run.status, ev.run.end_time) == ("cancelled", 99)
    (fin,) = client.take()
    assert fin["type"] == "RUN_FINISHED"
    assert fin["payload"] == {"run_id": "r1", "status": "cancelled"}
    assert set(client.s.runs) == {"r2"}


def test_finish_run_with_error_has_status_error(session):
    session.work.start_run(5, run_id="r")
    run = session.work.finish_run("r", 9, error={"code": "X"})
    assert (run.status, run.error, run.end_time) == ("error", {"code": "X"}, 9)
    out = [json.loads(d) for _, d in session.take_writable(9)]
    assert out[-1]["payload"] == {"run_id": "r", "status": "error", "error": {"code": "X"}}


def test_run_to_dict_uses_spec_field_names():
    r = Run("r1", 10, thread_id="t", status="finished", end_time=20, summary="s")
    assert r.to_dict() == {"runId": "r1", "threadId": "t", "status": "finished",
                           "startTime": 10, "endTime": 20, "summary": "s"}
    assert Run("r2", 1).to_dict() == {"runId": "r2", "status": "active", "startTime": 1}


# -- ACK and replay ----------------------------------------------------------------------------


def produce(client, n):
    """n PONGs; returns {seq: bytes} of everything written."""
    for i in range(n):
        client.send("PING", {"nonce": f"n{i}"})
    return dict(client.take_raw())


def test_ack_drops_the_replay_window_up_to_seq(client):
    produce(client, 4)  # seqs 2..5 (1 is the HELLO reply)
    assert set(snapshot(client.s)["replayWindow"]) == {"1", "2", "3", "4", "5"}
    client.send("ACK", {"seq": "3"})
    snap = snapshot(client.s)
    assert set(snap["replayWindow"]) == {"4", "5"}
    assert snap["lastAck"] == "3"
    client.send("ACK", {"seq": 4})  # integers are accepted too
    assert set(snapshot(client.s)["replayWindow"]) == {"5"}
    assert snapshot(client.s)["lastAck"] == "4"
    assert client.take() == []  # ACK is not answered


def test_ack_never_moves_backwards_or_beyond_what_was_sent(client):
    produce(client, 2)  # up to seq 3
    client.send("ACK", {"seq": "2"})
    client.send("ACK", {"seq": "1"})
    assert snapshot(client.s)["lastAck"] == "2"
    client.send("ACK", {"seq": "999"})
    assert snapshot(client.s)["lastAck"] == "3"


def test_replay_request_resends_with_original_seq_and_bytes(client):
    sent = produce(client, 4)  # 2..5
    client.send("REPLAY_REQUEST", {"from_seq": "3", "to_seq": "4"})
    again = client.take_raw(now=5000)
    assert again == [(3, sent[3]), (4, sent[4])]
    # Replays do not consume seqs: the next new message is 6.
    client.send("PING", {"nonce": "next"})
    assert seqs(client.take()) == [6]


def test_replay_request_without_to_seq_goes_to_the_end(client):
    sent = produce(client, 3)  # 2..4
    client.send("REPLAY_REQUEST", {"from_seq": 3})
    assert client.take_raw() == [(3, sent[3]), (4, sent[4])]


def test_replay_request_uses_numeric_order(client):
    sent = produce(client, 11)  # 2..12
    client.send("REPLAY_REQUEST", {"from_seq": "9", "to_seq": "11"})
    again = client.take_raw()
    assert [s for s, _ in again] == [9, 10, 11]
    assert [d for _, d in again] == [sent[9], sent[10], sent[11]]


def test_replay_request_beyond_what_was_sent_is_empty(client):
    produce(client, 2)
    client.send("REPLAY_REQUEST", {"from_seq": "10"})
    client.send("REPLAY_REQUEST", {"from_seq": "10", "to_seq": "20"})
    assert client.take() == []


def test_replay_request_before_the_window_replays_the_rest_then_replay_unavailable():
    s = make_session(replay_window_size=3)
    c = Client(s)
    c.handshake()
    sent = produce(c, 5)  # 2..6; window keeps 4, 5, 6
    c.send("REPLAY_REQUEST", {"from_seq": "2"}, id="rr")
    out = c.take_raw()
    assert out[:3] == [(4, sent[4]), (5, sent[5]), (6, sent[6])]
    assert len(out) == 4
    seq, data = out[3]
    err = json.loads(data)
    assert seq == 7 and err["seq"] == "7"
    assert err["type"] == "ERROR"
    assert err["payload"]["code"] == "REPLAY_UNAVAILABLE"
    assert err["payload"]["detail"]["first_available"] == "4"
    assert err["payload"]["related_id"] == "rr"


def test_replay_request_of_acked_messages_is_unavailable(client):
    produce(client, 3)  # 2..4
    client.send("ACK", {"seq": "3"})
    client.send("REPLAY_REQUEST", {"from_seq": "2"})
    out = client.take()
    assert seqs(out[:1]) == [4]
    assert error_codes(out) == ["REPLAY_UNAVAILABLE"]
    assert out[-1]["payload"]["detail"]["first_available"] == "4"


def test_attach_with_last_seq_replays_everything_after_it(client):
    sent = produce(client, 4)  # 2..5
    s = client.s
    s.detach(10)
    assert s.connected is False
    s.send(messages.text_part("m", "while away"))
    stored = s.take_writable(20)  # stored while disconnected: gets seq 6
    assert [q for q, _ in stored] == [6]
    s.attach(30, last_seq=3)
    assert s.connected is True
    again = s.take_writable(30)
    assert again == [(4, sent[4]), (5, sent[5]), stored[0]]


def test_attach_with_last_seq_up_to_date_replays_nothing(client):
    produce(client, 2)  # 2..3
    client.s.detach(5)
    client.s.attach(6, last_seq=3)
    assert client.take() == []


def test_attach_with_lost_start_replays_what_is_left_then_replay_unavailable():
    s = make_session(replay_window_size=2)
    c = Client(s)
    c.handshake()
    sent = produce(c, 4)  # 2..5; window 4, 5
    s.detach(1)
    s.attach(2, last_seq=1)
    out = s.take_writable(2)
    assert out[:2] == [(4, sent[4]), (5, sent[5])]
    (seq, data), = out[2:]
    err = json.loads(data)
    assert seq == 6
    assert err["payload"]["code"] == "REPLAY_UNAVAILABLE"
    assert err["payload"]["detail"] == {"first_available": "4"}


def test_attach_with_everything_expired_reports_the_next_seq_as_first_available():
    s = make_session(replay_window_time=1000)
    c = Client(s)
    c.handshake()  # seq 1 at t=0
    produce(c, 1)  # seq 2 at t=0
    s.detach(10)
    s.attach(5000, last_seq=0)
    out = [json.loads(d) for _, d in s.take_writable(5000)]
    assert error_codes(out) == ["REPLAY_UNAVAILABLE"]
    assert out[0]["seq"] == "3"
    assert out[0]["payload"]["detail"]["first_available"] == "3"


def test_replay_window_keeps_control_messages_too(client):
    client.send("PING", {"nonce": "p"})
    client.send("MESSAGE_END", {"message_id": "x"})
    client.take()
    window = snapshot(client.s)["replayWindow"]
    assert [window[k]["type"] for k in ("1", "2", "3")] == ["HELLO", "PONG", "ERROR"]


# -- heartbeat ----------------------------------------------------------------------------------


def hb_session():
    s = make_session(heartbeat_interval=1000, heartbeat_timeout=300)
    c = Client(s)
    c.handshake()
    return s, c


def test_ping_is_sent_after_the_interval():
    s, c = hb_session()
    assert tick_events(s, 999) == []
    assert c.take(now=999) == []
    assert tick_events(s, 1000) == []
    (ping,) = c.take(now=1000)
    assert (ping["type"], ping["channel"]) == ("PING", "SYSTEM")
    assert isinstance(ping["payload"]["nonce"], str) and ping["payload"]["nonce"]


def test_no_matching_pong_times_out():
    s, c = hb_session()
    tick_events(s, 1000)
    (ping,) = c.take(now=1000)
    c.send("PONG", {"nonce": "wrong-" + ping["payload"]["nonce"]}, now=1100)
    assert tick_events(s, 1299) == []
    assert tick_events(s, 1300) == [HeartbeatTimedOut()]


def test_matching_pong_clears_the_heartbeat():
    s, c = hb_session()
    tick_events(s, 1000)
    (ping,) = c.take(now=1000)
    c.send("PONG", {"nonce": ping["payload"]["nonce"]}, now=1200)
    assert c.take(now=1200) == []  # PONG is not answered
    assert tick_events(s, 1300) == []
    assert tick_events(s, 1999) == []
    assert c.take(now=1999) == []
    tick_events(s, 2000)  # next interval: a fresh PING with a fresh nonce
    (ping2,) = c.take(now=2000)
    assert ping2["type"] == "PING"
    assert ping2["payload"]["nonce"] != ping["payload"]["nonce"]


def test_no_heartbeat_while_disconnected():
    s, c = hb_session()
    s.detach(0)
    assert tick_events(s, 5000) == []
    assert c.take(now=5000) == []


def test_attach_restarts_the_heartbeat_clock():
    s, c = hb_session()
    s.detach(100)
    s.attach(900)
    tick_events(s, 1000)
    assert c.take(now=1000) == []
    tick_events(s, 1900)
    assert types(c.take(now=1900)) == ["PING"]


# -- expiry -------------------------------------------------------------------------------------


def test_disconnected_session_expires_after_the_replay_window_time():
    s = make_session(replay_window_time=5000)
    c = Client(s)
    c.handshake()
    s.detach(1000)
    assert tick_events(s, 5999) == []
    assert s.closed is False
    assert tick_events(s, 6000) == [Expired()]
    assert s.closed is True
    assert s.send(messages.ping("x")) is False


def test_reattaching_in_time_prevents_expiry():
    s = make_session(replay_window_time=5000)
    s.detach(1000)
    s.attach(5000)
    assert all(not isinstance(e, Expired) for e in tick_events(s, 10_000))
    assert s.closed is False


def test_connected_session_does_not_expire():
    s = make_session(replay_window_time=100, heartbeat_interval=10**9)
    assert tick_events(s, 10_000) == []


# -- snapshot -----------------------------------------------------------------------------------


def test_snapshot_has_the_spec_session_fields(client):
    client.now = 42
    client.send("RUN_STARTED", {"run_id": "r1"})
    client.take()
    client.send("PAUSE_CHANNEL", {"channel": "AGENT"})
    client.s.send(messages.text_part("m", "held"))
    assert client.take() == []
    snap = snapshot(client.s)
    spec_fields = {"id", "userId", "connected", "handshakeCompleted", "lastActivity", "credits",
                   "byteCredits", "pausedChannels", "lastAck", "lastDeliveredSeq",
                   "replayWindow", "activeRuns", "pendingMessages"}
    assert spec_fields <= set(snap)
    assert snap["id"] == "sess-1" and snap["userId"] == "user-1"
    assert snap["connected"] is True and snap["handshakeCompleted"] is True
    assert snap["lastActivity"] == 42
    assert snap["pausedChannels"] == {"AGENT"}
    assert snap["activeRuns"] == {"r1"}
    assert snap["lastAck"] == "0"
    assert snap["lastDeliveredSeq"] == "2"  # HELLO, RUN_STARTED
    assert set(snap["replayWindow"]) == {"1", "2"}
    (pending,) = snap["pendingMessages"].values()
    assert pending["type"] == "MESSAGE_PART" and pending["payload"]["content"] == "held"
    # USER spent one message credit on RUN_STARTED (PAUSE_CHANNEL is control: free).
    settings = client.s.settings.credits
    assert snap["credits"] == {"USER": settings.initial_credit_messages - 1}


def test_snapshot_credits_count_the_frame_bytes(client):
    client.send("MESSAGE_START", {"message_id": "m", "content_type": "text/plain"})
    frame = client.last_raw
    snap = snapshot(client.s)
    s = client.s.settings.credits
    assert snap["credits"] == {"USER": s.initial_credit_messages - 1}
    assert snap["byteCredits"] == {"USER": s.initial_credit_bytes - len(frame)}


def test_new_session_snapshot():
    s = ProtocolSession("abc", "u", make_session(attach=False).settings, 7)
    snap = snapshot(s)
    assert (snap["connected"], snap["handshakeCompleted"], snap["lastActivity"]) == (
        False, False, 7)
    assert (snap["lastAck"], snap["lastDeliveredSeq"]) == ("0", "0")
    assert snap["replayWindow"] == {} and snap["pendingMessages"] == {}
    assert snap["activeRuns"] == set() and snap["pausedChannels"] == set()


# -- audio ---------------------------------------------------------------------------------------


def test_audio_chunk_is_decoded(client):
    from protoflask.core.session import AudioReceived
    (ev,) = client.send("AUDIO_CHUNK", {"message_id": "a", "mime": "audio/wav",
                                        "data": "AAEC", "final": True})
    assert isinstance(ev, AudioReceived) and ev.data == b"\x00\x01\x02"
    assert ev.message["payload"]["final"] is True
    client.send("AUDIO_CHUNK", {"message_id": "a", "mime": "audio/wav", "data": "!!!"})
    assert error_codes(client.take()) == ["INVALID_MESSAGE"]


def test_error_detail_with_list_index_keys_is_still_sent(client):
    # marshmallow keys list errors by index (an int); the ERROR must still be encodable.
    client.send("HELLO", {"proto_version": "1.1.2", "accept_major": ["1"]}, id="h2")
    (err,) = client.take()
    assert err["payload"]["code"] == "INVALID_MESSAGE"
    assert err["payload"]["detail"] == {"accept_major": {"0": ["Not a valid integer."]}}
    client.send("PING", {"nonce": "after"})
    assert types(client.take()) == ["PONG"]


def test_payload_with_non_string_keys_from_the_application_is_sent(client):
    client.s.send(messages.create("TOOL_DONE", {"call_id": "c", "status": "OK",
                                                "result": {1: "one"}}))
    (done,) = client.take()
    assert done["payload"]["result"] == {"1": "one"}


def test_expired_is_reported_once():
    from protoflask.core.session import Expired, ProtocolSession
    s = ProtocolSession("S", "u", session_settings(replay_window_time=100), now=0)
    s.detach(0)
    assert [type(e) for e in tick_events(s, 150)] == [Expired]
    assert tick_events(s, 300) == [] and s.closed


def test_application_payload_must_be_json():
    import pytest
    from protoflask.core import messages
    from protoflask.core.errors import InvalidMessage
    with pytest.raises(InvalidMessage):
        messages.from_dict({"type": "X", "channel": "AGENT", "payload": {"when": {1, 2}}})
