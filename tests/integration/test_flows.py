"""The flows of docs/PROTOCOL.md §4 and its in-protocol errors (§6), over every transport.

Each test runs once per entry of tests.support.CLIENTS with the same assertions.
"""

from __future__ import annotations

import json
import queue

import pytest

from protoflask import signals

from ..support import hello_payload, wait_for


def test_handshake_reply(server, token, make_client):
    client = make_client(server, token)
    reply = client.hello()
    p = reply["payload"]
    assert reply["channel"] == "SYSTEM"
    assert p["proto_version"] == "1.1.2"
    assert p["accept_major"] == [1]
    assert {"HELLO", "PONG", "TOOL_DONE", "MESSAGE_PART"} <= set(p["accept_events"])
    assert p["session"] == reply["session"] and p["session"]
    assert p["last_client_seq"] == "0"
    caps = p["capabilities"]
    assert caps["flow_control"]["initial_credit_messages"] == 1000
    assert caps["flow_control"]["initial_credit_bytes"] == 1048576
    assert caps["max_concurrent_runs"] == 10
    assert caps["replay_window"] == {"size": 1000, "time_ms": 60000}
    assert caps["heartbeat_interval_ms"] == 30000
    assert caps["max_message_size"] == 1048576
    snapshot = server.get_session(p["session"])
    assert snapshot["handshakeCompleted"] is True and snapshot["userId"] == "alice"


def test_envelope_fields_and_downstream_seq(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    for i in range(3):
        client.send("PING", "SYSTEM", {"nonce": f"n{i}"})
        client.recv_type("PONG", nonce=f"n{i}")
    seqs = [int(m["seq"]) for m in client.received]
    assert seqs == list(range(1, len(seqs) + 1))
    for m in client.received:
        assert set(m) == {"id", "session", "seq", "ts", "type", "channel", "payload"}
        assert m["session"] == client.session_id
        assert isinstance(m["seq"], str) and isinstance(m["ts"], str) and m["ts"].isdigit()
    assert len({m["id"] for m in client.received}) == len(client.received)


def test_ping_before_and_after_handshake(server, token, make_client):
    client = make_client(server, token)
    client.send("PING", "SYSTEM", {"nonce": "early"})
    assert client.recv_type("PONG")["payload"]["nonce"] == "early"
    client.hello()
    client.send("PING", "SYSTEM", {"nonce": "later"})
    pong = client.recv_type("PONG")
    assert pong["payload"] == {"nonce": "later"} and pong["channel"] == "SYSTEM"


def test_text_is_echoed_and_assembled_for_listeners(server, token, make_client):
    got: queue.Queue = queue.Queue()
    server.on("textMessage", lambda sid, msg: got.put((sid, msg)))
    client = make_client(server, token)
    client.hello()
    client.send("MESSAGE_START", payload={"message_id": "m1", "content_type": "text/plain"})
    client.send("MESSAGE_PART", payload={"message_id": "m1", "content": "Hello, "})
    client.send("MESSAGE_PART", payload={"message_id": "m1", "content": "world"})
    client.send("MESSAGE_END", payload={"message_id": "m1"})
    start = client.recv_type("MESSAGE_START")
    echo_id = start["payload"]["message_id"]
    assert echo_id != "m1" and start["channel"] == "AGENT"
    parts = []
    end = client.recv_until(lambda m: m["type"] == "MESSAGE_END" or (
        m["type"] == "MESSAGE_PART" and parts.append(m["payload"]["content"]) is None and False))
    assert "".join(parts) == "Hello, world"
    assert end["payload"]["message_id"] == echo_id
    events = [got.get(timeout=5) for _ in range(4)]
    assert [e[1]["type"] for e in events] == ["MESSAGE_START", "MESSAGE_PART", "MESSAGE_PART",
                                              "MESSAGE_END"]
    assert events[-1][0] == client.session_id
    assert events[-1][1]["payload"]["text"] == "Hello, world"
    assert events[-1][1]["payload"]["content_type"] == "text/plain"


def test_echo_off(make_server, make_client):
    server = make_server(echoMessages=False)
    client = make_client(server, server.issue_token("bob"))
    client.hello()
    client.send("MESSAGE_START", payload={"message_id": "m", "content_type": "text/plain"})
    client.send("MESSAGE_END", payload={"message_id": "m"})
    client.send("PING", "SYSTEM", {"nonce": "after"})
    client.recv_type("PONG", nonce="after")
    assert not [m for m in client.received if m["type"].startswith("MESSAGE_")]


@pytest.mark.parametrize("tool,params,result", [
    ("echo", {"message": "hi"}, {"echoed": "hi"}),
    ("add", {"a": 2, "b": 40.5}, {"result": 42.5}),
])
def test_builtin_tools(server, token, make_client, tool, params, result):
    client = make_client(server, token)
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "c1", "tool": tool, "params": params})
    done = client.recv_type("TOOL_DONE")
    assert done["payload"] == {"call_id": "c1", "status": "OK", "result": result}
    assert done["channel"] == "AGENT"


def test_tool_call_event(server, token, make_client):
    calls: queue.Queue = queue.Queue()
    signals.tool_call.connect(lambda sender, **kw: calls.put(kw), sender=server, weak=False)
    client = make_client(server, token)
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "k", "tool": "add", "params": {"a": 1, "b": 1}})
    client.recv_type("TOOL_DONE")
    kw = calls.get(timeout=5)
    assert kw["session_id"] == client.session_id
    assert kw["execution"].call_id == "k" and kw["execution"].tool_name == "add"
    assert kw["execution"].to_dict()["arguments"] == {"a": 1, "b": 1}


# -- errors --------------------------------------------------------------------------------


def test_invalid_json_keeps_connection(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send_raw("{not json")
    err = client.expect_error("INVALID_MESSAGE")
    assert err["channel"] == "SYSTEM" and err["payload"]["message"]
    client.send("PING", "SYSTEM", {"nonce": "still"})
    client.recv_type("PONG", nonce="still")


@pytest.mark.parametrize("mutation", [
    {"seq": 5},  # seq must be a string
    {"seq": "0"},
    {"ts": 123},
    {"channel": "ELSEWHERE"},
    {"payload": "text"},
    {"id": ""},
])
def test_invalid_envelope(server, token, make_client, mutation):
    client = make_client(server, token)
    client.hello()
    env = {**client.envelopes.make("PING", "SYSTEM", {"nonce": "x"}), **mutation}
    client.send_raw(json.dumps(env))
    err = client.expect_error("INVALID_MESSAGE")
    assert err["payload"]["detail"]


def test_missing_field(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send_raw('{"id": "x1", "seq": "9", "ts": "1", "type": "PING", "channel": "SYSTEM"}')
    err = client.expect_error("INVALID_MESSAGE")
    assert err["payload"]["related_id"] == "x1"


def test_unsupported_type(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    sent = client.send("TELEPORT", payload={})
    err = client.expect_error("UNSUPPORTED_TYPE")
    assert err["payload"]["related_id"] == sent["id"]


def test_handshake_required(server, token, make_client):
    client = make_client(server, token)
    sent = client.send("TOOL_CALL", payload={"call_id": "c", "tool": "echo",
                                             "params": {"message": "x"}})
    err = client.expect_error("HANDSHAKE_REQUIRED")
    assert err["payload"]["related_id"] == sent["id"]
    client.hello()
    assert not [m for m in client.received if m["type"] == "TOOL_DONE"]


def test_bad_payload(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send("MESSAGE_PART", payload={"message_id": "m"})
    assert "content" in client.expect_error("INVALID_MESSAGE")["payload"]["detail"]
    client.send("MESSAGE_PART", payload={"message_id": "never-started", "content": "x"})
    client.expect_error("INVALID_MESSAGE")


def test_tool_not_found(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "c9", "tool": "nope", "params": {}})
    done = client.recv_type("TOOL_DONE")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_NOT_FOUND"
    client.expect_error("TOOL_NOT_FOUND")


def test_tool_params_fail_schema(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "c", "tool": "add", "params": {"a": "x"}})
    done = client.recv_type("TOOL_DONE")
    assert done["payload"]["status"] == "ERROR"
    err = client.expect_error("INVALID_MESSAGE")
    assert err["payload"]["detail"] and isinstance(err["payload"]["detail"], list)


def test_duplicate_call_id(make_server, make_client):
    server = make_server()

    @server.tool("slow", input_schema={"type": "object"}, output_schema={"type": "object"})
    def slow(params, *_):
        import gevent
        gevent.sleep(0.3)
        return {"ok": True}

    client = make_client(server, server.issue_token("u"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "d", "tool": "slow", "params": {}})
    client.send("TOOL_CALL", payload={"call_id": "d", "tool": "slow", "params": {}})
    client.expect_error("DUPLICATE_CALL_ID")
    done = client.recv_type("TOOL_DONE")
    assert done["payload"] == {"call_id": "d", "status": "OK", "result": {"ok": True}}
    client.send("PING", "SYSTEM", {"nonce": "end"})
    client.recv_type("PONG", nonce="end")
    assert len([m for m in client.received if m["type"] == "TOOL_DONE"]) == 1


def test_runs_and_run_errors(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send("RUN_FINISHED", payload={})
    client.expect_error("MISSING_RUN_ID")
    client.send("RUN_CANCEL", payload={"run_id": "ghost"})
    client.expect_error("RUN_NOT_FOUND")
    client.send("RUN_STARTED", payload={"thread_id": "t1"})
    started = client.recv_type("RUN_STARTED")
    run_id = started["payload"]["run_id"]
    assert run_id and started["payload"]["thread_id"] == "t1"
    client.send("RUN_FINISHED", payload={"run_id": run_id, "summary": "done"})
    finished = client.recv_type("RUN_FINISHED")
    assert finished["payload"] == {"run_id": run_id, "status": "finished", "summary": "done"}


def test_max_runs_exceeded(make_server, make_client):
    server = make_server(maxConcurrentRuns=2)
    client = make_client(server, server.issue_token("u"))
    client.hello()
    for i in range(2):
        client.send("RUN_STARTED", payload={"run_id": f"r{i}"})
        client.recv_type("RUN_STARTED", run_id=f"r{i}")
    client.send("RUN_STARTED", payload={"run_id": "r2"})
    client.expect_error("MAX_RUNS_EXCEEDED")
    client.send("RUN_CANCEL", payload={"run_id": "r0"})
    assert client.recv_type("RUN_FINISHED", run_id="r0")["payload"]["status"] == "cancelled"
    client.send("RUN_STARTED", payload={"run_id": "r2"})
    client.recv_type("RUN_STARTED", run_id="r2")


def test_insufficient_credits(make_server, make_client):
    server = make_server(flowControl={"initialCreditBytes": 300, "creditThreshold": 0})
    client = make_client(server, server.issue_token("u"))
    client.hello()
    big = "x" * 400
    client.send("MESSAGE_START", payload={"message_id": big, "content_type": "text/plain"})
    err = client.expect_error("INSUFFICIENT_CREDITS")
    assert err["payload"]["detail"]["channel"] == "USER"
    # control messages never need credit
    client.send("PING", "SYSTEM", {"nonce": "ok"})
    client.recv_type("PONG", nonce="ok")


def test_unsupported_version_closes(server, token, make_client):
    client = make_client(server, token)
    client.send("HELLO", "SYSTEM", hello_payload(proto_version="2.0.0", accept_major=[2]))
    client.expect_error("UNSUPPORTED_VERSION")
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="session closed")


def test_retransmission_is_dropped(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    first = client.send("PING", "SYSTEM", {"nonce": "once"})
    client.recv_type("PONG", nonce="once")
    client.send_raw(json.dumps(first))  # same seq again
    client.send("PING", "SYSTEM", {"nonce": "next"})
    client.recv_type("PONG", nonce="next")
    assert [m["payload"]["nonce"] for m in client.received if m["type"] == "PONG"] == \
        ["once", "next"]


def test_accept_events_filter(server, token, make_client):
    client = make_client(server, token)
    client.hello(accept_events=["TOOL_DONE"])
    client.send("PING", "SYSTEM", {"nonce": "filtered"})  # PONG is not accepted
    client.send("TOOL_CALL", payload={"call_id": "a", "tool": "add", "params": {"a": 1, "b": 2}})
    done = client.recv_type("TOOL_DONE")
    assert not [m for m in client.received if m["type"] == "PONG"]
    # the filtered PONG took no seq
    assert int(done["seq"]) == int(client.received[0]["seq"]) + 1


def test_stats_count_messages_and_errors(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    client.send_raw("garbage")
    client.expect_error("INVALID_MESSAGE")
    stats = wait_for(lambda: (s := server.get_stats())["totalMessages"] >= 2 and s)
    assert stats["totalMessages"] == 2
    assert stats["errorRate"] == pytest.approx(0.5)
    assert stats["messagesPerSecond"] > 0


# -- connection refusals and the remaining errors, on every transport -----------------------


def refusal(exc: BaseException) -> tuple[int, dict]:
    """(HTTP status, JSON body) of a refused connection, whichever client refused."""
    from websockets.exceptions import InvalidStatus

    from ..support import HTTPRefused

    if isinstance(exc, InvalidStatus):
        return exc.response.status_code, json.loads(exc.response.body)
    assert isinstance(exc, HTTPRefused), exc
    return exc.status, exc.json()


@pytest.mark.parametrize("token_value,code", [(None, "MISSING_TOKEN"),
                                              ("not.a.jwt", "INVALID_TOKEN")])
def test_connection_refused_without_a_valid_token(server, make_client, token_value, code):
    with pytest.raises(Exception) as info:
        make_client(server, token_value)
    status, body = refusal(info.value)
    assert status == 401 and body["error"]["code"] == code and body["error"]["message"]


def test_connection_refused_beyond_max_connections(make_server, make_client):
    server = make_server(maxConnections=1)
    token = server.issue_token("u")
    first = make_client(server, token)
    first.hello()
    with pytest.raises(Exception) as info:
        make_client(server, token)
    status, body = refusal(info.value)
    assert status == 503 and body["error"]["code"] == "MAX_CONNECTIONS"
    first.close()
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="slot freed")
    make_client(server, token).hello()


def test_tool_execution_error(make_server, make_client):
    server = make_server()

    @server.tool("boom", input_schema={"type": "object"}, output_schema={"type": "object"})
    def boom(params, *_):
        raise RuntimeError("kaput")

    client = make_client(server, server.issue_token("u"))
    client.hello()
    sent = client.send("TOOL_CALL", payload={"call_id": "b", "tool": "boom", "params": {}})
    done = client.recv_type("TOOL_DONE")
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_EXECUTION_ERROR"
    err = client.expect_error("TOOL_EXECUTION_ERROR")
    assert "kaput" in err["payload"]["message"] and err["payload"]["related_id"] == sent["id"]


def test_message_too_large_is_reported(make_server, make_client):
    server = make_server(maxMessageSize=2048)
    client = make_client(server, server.issue_token("u"))
    client.hello()
    client.send("MESSAGE_START", payload={"message_id": "x" * 4096, "content_type": "t"})
    client.expect_error("MESSAGE_TOO_LARGE")
    assert server.get_session(client.session_id) is not None  # kept for resume


def test_inline_tools_skip_the_pool(make_server, make_client):
    import gevent

    server = make_server(maxConcurrentRuns=1)

    @server.tool("slow", input_schema={"type": "object"}, output_schema={"type": "object"})
    def slow(params, *_):
        gevent.sleep(0.5)
        return {}

    @server.tool("double", input_schema={"type": "object"}, output_schema={"type": "object"},
                 inline=True)
    def double(params, session_id, call_id, srv):
        if params.get("fail"):
            raise ValueError("no")
        return {"value": params["n"] * 2}

    client = make_client(server, server.issue_token("u"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "s", "tool": "slow", "params": {}})
    client.send("TOOL_CALL", payload={"call_id": "a", "tool": "double", "params": {"n": 21}})
    first_done = client.recv_type("TOOL_DONE")
    # the pool's single slot is busy, yet the inline call finished first, never queued
    assert first_done["payload"] == {"call_id": "a", "status": "OK", "result": {"value": 42}}
    client.send("TOOL_CALL", payload={"call_id": "b", "tool": "double",
                                      "params": {"fail": True}})
    assert client.recv_type("TOOL_DONE", call_id="b")["payload"]["status"] == "ERROR"
    client.expect_error("TOOL_EXECUTION_ERROR")
    client.recv_type("TOOL_DONE", call_id="s")
    assert not [m for m in client.received if m["type"] == "TOOL_UPDATE"]
