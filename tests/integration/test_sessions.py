"""Sessions that survive (issue 4): flow control both ways, back-pressure, heartbeats,
replay and resume, over every transport; the slow-consumer bound over WebSocket."""

from __future__ import annotations

import queue
import socket
import threading

import gevent
import pytest

from protoflask import signals

from ..support import WSClient, timeout, wait_for


def texts(client, n, within=5.0):
    """The next n MESSAGE_PART contents (other messages are skipped)."""
    out = []
    client.recv_until(lambda m: m["type"] == "MESSAGE_PART" and out.append(
        m["payload"]["content"]) is None and len(out) >= n, within)
    return out


def push_parts(server, session_id, contents):
    for c in contents:
        server.send_message(session_id, {"type": "MESSAGE_PART", "channel": "AGENT",
                                         "payload": {"message_id": "push", "content": c}})


# -- upstream credit -------------------------------------------------------------------------


def test_client_within_its_grants_is_never_rejected(make_server, make_client):
    server = make_server(flowControl={"initialCreditMessages": 5, "creditThreshold": 1,
                                      "initialCredits": 4, "adaptiveAdjustment": False})
    client = make_client(server, server.issue_token("u"))
    # initialCredits (4) would be the downstream credit of a client asking for downstream
    # credit without announcing its own; this one does not ask, so all 40 TOOL_DONEs come.
    reply = client.hello(capabilities={"flow_control": {"initial_credit_messages": 1000}})
    credit = reply["payload"]["capabilities"]["flow_control"]["initial_credit_messages"]
    assert credit == 5
    waited = 0
    done = 0
    sent = 0
    while done < 40:
        if credit > 0 and sent < 40:
            client.send("TOOL_CALL", payload={"call_id": f"c{sent}", "tool": "echo",
                                              "params": {"message": "x"}})
            sent += 1
            credit -= 1
            continue
        waited += credit == 0
        msg = client.recv()
        if msg["type"] == "FLOW_UPDATE":
            assert msg["payload"]["channel"] == "USER"
            credit += msg["payload"]["add_messages"]
        elif msg["type"] == "TOOL_DONE":
            assert msg["payload"]["status"] == "OK"
            done += 1
        assert msg["type"] != "ERROR", msg
    assert waited > 0  # it did run out and got credit back
    assert any(m["type"] == "FLOW_UPDATE" for m in client.received)


def test_message_larger_than_byte_credit_is_rejected_unprocessed(make_server, make_client):
    server = make_server(flowControl={"initialCreditBytes": 400})
    client = make_client(server, server.issue_token("u"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "big", "tool": "echo",
                                      "params": {"message": "y" * 500}})
    err = client.expect_error("INSUFFICIENT_CREDITS")
    assert err["payload"]["detail"]["needed_bytes"] > 400
    client.send("TOOL_CALL", payload={"call_id": "small", "tool": "echo",
                                      "params": {"message": "ok"}})
    assert client.recv_type("TOOL_DONE")["payload"]["call_id"] == "small"
    assert not [m for m in client.received
                if m["type"] == "TOOL_DONE" and m["payload"]["call_id"] == "big"]


def test_flow_control_disabled(make_server, make_client):
    server = make_server(flowControl={"enabled": False, "initialCreditBytes": 10})
    client = make_client(server, server.issue_token("u"))
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 1}})
    client.send("TOOL_CALL", payload={"call_id": "c", "tool": "echo",
                                      "params": {"message": "z" * 100}})
    client.recv_type("TOOL_DONE")
    push_parts(server, client.session_id, ["a", "b", "c"])
    assert texts(client, 3) == ["a", "b", "c"]
    assert not [m for m in client.received if m["type"] in ("FLOW_UPDATE", "ERROR")]


# -- downstream credit and pause -------------------------------------------------------------


def test_downstream_credit_and_pause_keep_order(server, token, make_client):
    client = make_client(server, token)
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 3,
                                                "downstream": True}})
    push_parts(server, client.session_id, [str(i) for i in range(10)])
    assert texts(client, 3) == ["0", "1", "2"]
    client.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 4})
    assert texts(client, 4) == ["3", "4", "5", "6"]
    client.send("PAUSE_CHANNEL", "SYSTEM", {"channel": "AGENT"})
    client.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 100})
    client.send("PING", "SYSTEM", {"nonce": "while-paused"})
    client.recv_type("PONG", nonce="while-paused")
    assert len([m for m in client.received if m["type"] == "MESSAGE_PART"]) == 7
    snapshot = server.get_session(client.session_id)
    assert "AGENT" in snapshot["pausedChannels"] and len(snapshot["pendingMessages"]) == 3
    client.send("RESUME_CHANNEL", "SYSTEM", {"channel": "AGENT"})
    assert texts(client, 3) == ["7", "8", "9"]
    seqs = [int(m["seq"]) for m in client.received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_back_pressure_pauses_user_then_resumes(make_server, make_client):
    server = make_server(outboundBufferSize=4096)
    client = make_client(server, server.issue_token("u"))
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 1,
                                                "downstream": True}})
    push_parts(server, client.session_id, ["x" * 200 for _ in range(30)])
    pause = client.recv_type("PAUSE_CHANNEL")
    assert pause["payload"] == {"channel": "USER"} and pause["channel"] == "SYSTEM"
    client.send("TOOL_CALL", payload={"call_id": "p", "tool": "echo",
                                      "params": {"message": "x"}})
    client.expect_error("CHANNEL_PAUSED")
    client.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 1000})
    client.recv_type("RESUME_CHANNEL", channel="USER")
    client.send("TOOL_CALL", payload={"call_id": "q", "tool": "echo",
                                      "params": {"message": "x"}})
    assert client.recv_type("TOOL_DONE")["payload"]["call_id"] == "q"


# -- heartbeat -------------------------------------------------------------------------------


def test_frozen_client_is_disconnected_and_kept(make_server, make_client):
    server = make_server(heartbeatInterval=100, heartbeatTimeout=200)
    gone: queue.Queue = queue.Queue()
    server.on("disconnect", gone.put)
    client = make_client(server, server.issue_token("u"))
    sid = client.hello()["payload"]["session"]
    client.recv_type("PING", within=3)  # and never answer
    assert gone.get(timeout=timeout(5)) == sid
    snapshot = server.get_session(sid)
    assert snapshot is not None and snapshot["connected"] is False
    # the slot is freed once the transport finished closing (a WebSocket close handshake)
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="slot freed")


def test_answering_client_stays(make_server, make_client):
    server = make_server(heartbeatInterval=80, heartbeatTimeout=200)
    gone: queue.Queue = queue.Queue()
    server.on("disconnect", gone.put)
    client = make_client(server, server.issue_token("u"))
    client.hello()
    for _ in range(5):
        ping = client.recv_type("PING", within=3)
        client.send("PONG", "SYSTEM", {"nonce": ping["payload"]["nonce"]})
    client.send("PING", "SYSTEM", {"nonce": "still-here"})
    client.recv_type("PONG", nonce="still-here")
    assert gone.empty()


# -- replay and resume -----------------------------------------------------------------------


def test_resume_after_drop_delivers_every_missed_message_once(make_server, make_client):
    server = make_server()
    finished = threading.Event()

    @server.tool("slow", input_schema={"type": "object"}, output_schema={"type": "object"})
    def slow(params, session_id, call_id, srv):
        gevent.sleep(0.3)
        return {"slept": True}

    signals.tool_call.connect(lambda *a, **k: None, sender=server, weak=False)
    token = server.issue_token("u")
    first = make_client(server, token)
    sid = first.hello()["payload"]["session"]
    first.send("PING", "SYSTEM", {"nonce": "before"})
    last_seq = int(first.recv_type("PONG", nonce="before")["seq"])
    first.send("TOOL_CALL", payload={"call_id": "during", "tool": "slow", "params": {}})
    first.drop()
    wait_for(lambda: server.get_session(sid)["connected"] is False, what="drop noticed")
    push_parts(server, sid, ["m1", "m2", "m3"])
    wait_for(lambda: not server.get_session(sid)["pendingMessages"] and
             int(server.get_session(sid)["lastDeliveredSeq"]) >= last_seq + 4,
             what="tool done while disconnected")
    finished.set()
    second = make_client(server, token, session=sid, last_seq=last_seq)
    second.envelopes = first.envelopes  # the client keeps counting its seq
    got = []
    second.recv_until(lambda m: got.append(m) is None and len(got) >= 4)
    types = [m["type"] for m in got]
    assert sorted(types) == ["MESSAGE_PART"] * 3 + ["TOOL_DONE"]
    assert [int(m["seq"]) for m in got] == list(range(last_seq + 1, last_seq + 5))
    assert [m["payload"]["content"] for m in got if m["type"] == "MESSAGE_PART"] == \
        ["m1", "m2", "m3"]
    done = next(m for m in got if m["type"] == "TOOL_DONE")
    assert done["payload"] == {"call_id": "during", "status": "OK", "result": {"slept": True}}
    # nothing is delivered twice, and a resent client message is dropped
    second.send("PING", "SYSTEM", {"nonce": "after"})
    pong = second.recv_type("PONG", nonce="after")
    assert int(pong["seq"]) == last_seq + 5
    assert len({m["seq"] for m in second.received}) == len(second.received)


def test_resume_with_another_users_token_fails(server, make_client):
    owner = make_client(server, server.issue_token("owner"))
    sid = owner.hello()["payload"]["session"]
    with pytest.raises(Exception) as info:
        make_client(server, server.issue_token("intruder"), session=sid, last_seq=0)
    assert "404" in str(info.value) or "SESSION_NOT_FOUND" in str(info.value)
    owner.send("PING", "SYSTEM", {"nonce": "mine"})
    owner.recv_type("PONG", nonce="mine")


def test_hello_after_resume_reports_last_client_seq(server, token, make_client):
    first = make_client(server, token)
    sid = first.hello()["payload"]["session"]
    first.send("PING", "SYSTEM", {"nonce": "x"})
    last = int(first.recv_type("PONG")["seq"])
    first.drop()
    wait_for(lambda: server.get_session(sid)["connected"] is False, what="drop noticed")
    second = make_client(server, token, session=sid, last_seq=last)
    second.envelopes = first.envelopes
    reply = second.hello()
    assert reply["payload"]["last_client_seq"] == str(first.envelopes.last_seq - 1)
    assert reply["payload"]["session"] == sid


def test_replay_request_and_unavailable(make_server, make_client):
    server = make_server(replayWindowSize=3)
    client = make_client(server, server.issue_token("u"))
    client.hello()
    push_parts(server, client.session_id, [str(i) for i in range(6)])
    texts(client, 6)
    last = int(client.received[-1]["seq"])
    client.send("REPLAY_REQUEST", "SYSTEM", {"from_seq": str(last - 1), "to_seq": last})
    replayed = [client.recv(), client.recv()]
    assert [int(m["seq"]) for m in replayed] == [last - 1, last]
    assert [m["payload"]["content"] for m in replayed] == ["4", "5"]
    client.send("REPLAY_REQUEST", "SYSTEM", {"from_seq": 1})
    err = client.expect_error("REPLAY_UNAVAILABLE")
    assert int(err["payload"]["detail"]["first_available"]) == last - 2
    assert int(err["seq"]) == last + 1  # the error is a new message


def test_ack_drops_from_the_window(server, token, make_client):
    client = make_client(server, token)
    client.hello()
    push_parts(server, client.session_id, ["a", "b", "c"])
    texts(client, 3)
    last = int(client.received[-1]["seq"])
    client.send("ACK", "SYSTEM", {"seq": str(last - 1)})
    wait_for(lambda: server.get_session(client.session_id)["lastAck"] == str(last - 1))
    window = server.get_session(client.session_id)["replayWindow"]
    assert set(window) == {str(last)}
    assert window[str(last)]["payload"]["content"] == "c"


# -- slow consumers (WebSocket: the transport where the client controls its reading) --------


class RawWebSocket:
    """A client that handshakes, sends HELLO and then never reads again."""

    def __init__(self, port: int, token: str) -> None:
        import orjson
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(timeout(5))
        self.sock.connect(("127.0.0.1", port))
        proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/proto/websocket?token={token}"))
        proto.send_request(proto.connect())
        self.sock.sendall(b"".join(proto.data_to_send()))
        while not proto.events_received():
            proto.receive_data(self.sock.recv(4096))
        proto.send_text(orjson.dumps({
            "id": "h", "session": "", "seq": "1", "ts": "0", "type": "HELLO",
            "channel": "SYSTEM", "payload": {"proto_version": "1.1.2", "accept_major": [1],
                                             "accept_events": []}}))
        self.sock.sendall(b"".join(proto.data_to_send()))

    def close(self) -> None:
        self.sock.close()


def test_slow_consumer_is_bounded_while_others_keep_answering(make_server):
    limit = 256 * 1024
    chunk = 16384
    server = make_server(outboundBufferSize=limit)
    gone: queue.Queue = queue.Queue()
    connected: queue.Queue = queue.Queue()
    server.on("disconnect", gone.put)
    server.on("handshake", lambda sid, payload: connected.put(sid))
    token = server.issue_token("u")
    frozen = RawWebSocket(server.port, token)
    healthy = WSClient(server.base_url, token)
    stop = threading.Event()
    peak = [0]
    try:
        sid = connected.get(timeout=timeout(5))
        healthy.hello()

        def flood():
            while not stop.is_set():
                try:
                    push_parts(server, sid, ["z" * chunk])
                    peak[0] = max(peak[0], server.get_session(sid)["outboundBytes"])
                except Exception:
                    return

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        for i in range(20):
            healthy.send("PING", "SYSTEM", {"nonce": f"h{i}"})
            healthy.recv_type("PONG", nonce=f"h{i}")
        assert gone.get(timeout=timeout(15)) == sid
        stop.set()
        flooder.join(timeout(5))
        assert 0 < peak[0] <= limit + chunk + 1024, peak[0]
        snapshot = server.get_session(sid)
        assert snapshot is not None and snapshot["connected"] is False  # kept for resume
        healthy.send("PING", "SYSTEM", {"nonce": "after"})
        healthy.recv_type("PONG", nonce="after")
    finally:
        stop.set()
        healthy.close()
        frozen.close()


def test_full_pending_queue_drops_and_reports(make_server, make_client):
    from protoflask import signals

    server = make_server()
    errors: queue.Queue = queue.Queue()
    signals.error.connect(lambda sender, **kw: errors.put(kw), sender=server, weak=False)
    client = make_client(server, server.issue_token("u"))
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 1,
                                                "downstream": True}})
    push_parts(server, client.session_id, ["0"])  # the client's one credit
    assert client.recv_type("MESSAGE_PART")["payload"]["content"] == "0"
    # 10000 held (max_pending_messages), 4 dropped: in one call into the server's hub (a
    # cross-thread call each took most of a minute)
    server._call(push_parts, server, client.session_id, [str(i) for i in range(1, 10005)])
    dropped = [errors.get(timeout=timeout(10)) for _ in range(4)]
    for kw in dropped:
        assert kw["error"].code == "OUTBOUND_QUEUE_FULL"
        assert kw["session_id"] == client.session_id
    assert errors.empty()
    snapshot = server.get_session(client.session_id)
    held = [m["payload"]["content"] for m in snapshot["pendingMessages"].values()]
    assert held == [str(i) for i in range(1, 10001)]  # the first 10000 kept, in order
