"""What only the WebSocket transport does: close codes, binary frames, frame-level limits,
compression negotiation, one writer under concurrent senders, heartbeats and resume."""

from __future__ import annotations

import queue
import socket

import gevent
import pytest
from websockets.exceptions import ConnectionClosed

from protoflask import signals

from ..support import WSClient, hello_payload, timeout, wait_for


def ws(server, token=None, **kw) -> WSClient:
    return WSClient(server.base_url, token, **kw)


def closed_with(client: WSClient) -> int | None:
    with pytest.raises(ConnectionClosed):
        while True:
            client.ws.recv(timeout=timeout(5))
    return client.ws.close_code


def test_unsupported_version_closes_4001(server, token):
    with ws(server, token) as client:
        client.send("HELLO", "SYSTEM", hello_payload(accept_major=[2, 3]))
        client.expect_error("UNSUPPORTED_VERSION")
        assert closed_with(client) == 4001


def test_too_large_gets_error_then_1009(make_server):
    server = make_server(maxMessageSize=1024)
    with ws(server, server.issue_token("u")) as client:
        client.hello()
        client.send_raw("x" * 5000)
        err = client.expect_error("MESSAGE_TOO_LARGE")
        assert "1024" in err["payload"]["message"]
        assert closed_with(client) == 1009
    # the session is kept for resume, the server still serves
    with ws(server, server.issue_token("u")) as other:
        other.hello()


def test_fragmented_message_is_reassembled(server, token):
    with ws(server, token) as client:
        client.hello()
        env = client.envelopes.make("PING", "SYSTEM", {"nonce": "frag"})
        text = __import__("json").dumps(env)
        client.ws.send([text[:10], text[10:30], text[30:]])  # websockets sends fragments
        client.recv_type("PONG", nonce="frag")


def test_invalid_utf8_closes_1007(server, token):
    with ws(server, token, compression=False) as client:
        client.hello()
        # a text frame whose payload is not UTF-8 (the client library won't send one)
        from websockets.frames import Frame, Opcode
        frame = Frame(Opcode.TEXT, b"\xff\xfe{}").serialize(mask=True, extensions=[])
        client.ws.socket.sendall(frame)
        assert closed_with(client) == 1007


def test_binary_frames_raise_binary(server, token):
    got: queue.Queue = queue.Queue()
    server.on("binary", lambda sid, data: got.put((sid, data)))
    with ws(server, token) as client:
        client.hello()
        client.ws.send(b"\x00\x01binary")
        sid, data = got.get(timeout=timeout(5))
        assert sid == client.session_id and data == b"\x00\x01binary"


@pytest.mark.parametrize("enabled", [True, False])
def test_permessage_deflate_follows_config(make_server, enabled):
    server = make_server(enableCompression=enabled)
    with ws(server, server.issue_token("u")) as client:
        header = client.ws.response.headers.get("Sec-WebSocket-Extensions")
        assert (header is not None and "permessage-deflate" in header) is enabled
        client.hello()


def test_upgrade_refused_before_handshake(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout(5)) as sock:
        sock.sendall(b"GET /proto/websocket?token=bogus HTTP/1.1\r\nHost: x\r\n"
                     b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or b"}" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 401")
    assert b'"code":"INVALID_TOKEN"' in data
    assert b"101" not in data.split(b"\r\n")[0]


def test_token_in_bearer_header(server, token):
    with ws(server, None, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.hello()["payload"]["session"]


def test_one_writer_under_concurrent_senders(make_server):
    """A tool streaming updates from its greenlet while the reader answers PINGs:
    every message arrives, in seq order, with no concurrent-write failure."""
    server = make_server()
    errors: queue.Queue = queue.Queue()
    signals.error.connect(lambda sender, **kw: errors.put(kw), sender=server, weak=False)

    @server.tool("stream", input_schema={"type": "object"}, output_schema={"type": "object"})
    def stream(params, session_id, call_id, srv):
        for i in range(200):
            srv.send_tool_update(session_id, call_id, "RUNNING", i / 2, partial="x" * 2000)
            if i % 20 == 0:
                gevent.sleep(0)
        return {"n": 200}

    with ws(server, server.issue_token("u")) as client:
        client.hello()
        client.send("TOOL_CALL", payload={"call_id": "s", "tool": "stream", "params": {}})
        for i in range(50):
            client.send("PING", "SYSTEM", {"nonce": str(i)})
        seen: set[str] = set()
        client.recv_until(lambda m: seen.add(m["type"] if m["type"] != "PONG"
                                             else "PONG" + m["payload"]["nonce"]) or
                          {"TOOL_DONE", "PONG49"} <= seen, within=10)
        updates = [m for m in client.received if m["type"] == "TOOL_UPDATE"]
        pongs = [m for m in client.received if m["type"] == "PONG"]
        assert len(updates) == 200 and len(pongs) == 50
        seqs = [int(m["seq"]) for m in client.received]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert errors.empty()


def test_heartbeat_disconnects_silent_client_4000(make_server):
    server = make_server(heartbeatInterval=100, heartbeatTimeout=150)
    disconnected: queue.Queue = queue.Queue()
    server.on("disconnect", disconnected.put)
    with ws(server, server.issue_token("u")) as client:
        sid = client.hello()["payload"]["session"]
        ping = client.recv_type("PING", within=3)
        assert ping["channel"] == "SYSTEM" and ping["payload"]["nonce"]
        assert closed_with(client) == 4000  # never answered
    assert disconnected.get(timeout=timeout(5)) == sid
    snapshot = server.get_session(sid)
    assert snapshot is not None and snapshot["connected"] is False  # kept for resume


def test_heartbeat_keeps_answering_client(make_server):
    server = make_server(heartbeatInterval=80, heartbeatTimeout=200)
    with ws(server, server.issue_token("u")) as client:
        client.hello()
        for _ in range(5):  # ~5 intervals, well past one timeout
            ping = client.recv_type("PING", within=3)
            client.send("PONG", "SYSTEM", {"nonce": ping["payload"]["nonce"]})
        client.send("PING", "SYSTEM", {"nonce": "alive"})
        client.recv_type("PONG", nonce="alive")
        assert client.ws.close_code is None


def test_resume_replays_missed_messages_and_supersedes(server, token):
    first = ws(server, token)
    try:
        sid = first.hello()["payload"]["session"]
        first.send("PING", "SYSTEM", {"nonce": "a"})
        last_seen = int(first.recv_type("PONG", nonce="a")["seq"])
        server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                                  "payload": {"message_id": "x", "content_type": "text/plain"}})
        first.recv_type("MESSAGE_START")
        second = ws(server, token, session=sid, last_seq=last_seen)
        try:
            replayed = second.recv_type("MESSAGE_START")
            assert int(replayed["seq"]) == last_seen + 1
            assert closed_with(first) == 4002
            second.send("PING", "SYSTEM", {"nonce": "b"}, seq=str(first.envelopes.last_seq + 1))
            second.envelopes = first.envelopes
            assert int(second.recv_type("PONG", nonce="b")["seq"]) == last_seen + 2
        finally:
            second.close()
    finally:
        first.close()


def test_resume_of_another_users_session_is_refused(server, token):
    with ws(server, token) as client:
        sid = client.hello()["payload"]["session"]
        with pytest.raises(Exception) as info:
            ws(server, server.issue_token("mallory"), session=sid, last_seq=0)
        assert "404" in str(info.value)


def test_stop_closes_with_1001(make_server):
    server = make_server()
    client = ws(server, server.issue_token("u"))
    try:
        client.hello()
        server.stop()
        assert closed_with(client) == 1001
    finally:
        client.close()


def test_connection_count_returns_to_zero(server, token):
    clients = [ws(server, token) for _ in range(5)]
    try:
        for c in clients:
            c.hello()
        assert server.get_stats()["activeConnections"] == 5
    finally:
        for c in clients:
            c.close()
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="connections closed")
    assert server.get_stats()["totalConnections"] == 5


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_matches_the_websockets_serializer(size):
    from websockets.frames import Frame, Opcode

    from protoflask.transports.websocket import text_frame

    data = b"x" * size
    assert text_frame(data) == Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])


def test_large_messages_arrive_intact_without_compression(make_server):
    server = make_server(enableCompression=False)
    with ws(server, server.issue_token("u"), compression=False) as client:
        client.hello()
        for size in (100, 1000, 70000):
            server.send_message(client.session_id, {
                "type": "MESSAGE_PART", "channel": "AGENT",
                "payload": {"message_id": "m", "content": "y" * size}})
            part = client.recv_type("MESSAGE_PART")
            assert part["payload"]["content"] == "y" * size
