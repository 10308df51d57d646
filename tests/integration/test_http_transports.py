"""What is specific to the SSE and HTTP-streaming transports (docs/PROTOCOL.md §9): framing,
POST bodies and their answers, HTTP errors, resume, headers, and clients going away.

The generic flows run over these transports too (test_flows.py via tests.support.CLIENTS).
Real servers on port 0, real sockets; every wait has a deadline.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest
import requests


from ..support import (
    SECRET, Envelopes, GunicornServer, HTTPRefused, HTTPResponseReader, SSEClient,
    StreamClient, StreamEnded, chunk, hello_payload, open_http, timeout, wait_for,
)

HTTP_CLIENTS = {"sse": SSEClient, "stream": StreamClient}


@pytest.fixture
def clients() -> Iterator[Callable[..., Any]]:
    """SSE / stream clients by name, all closed after the test."""
    made: list[Any] = []

    def make(kind: str, server: Any, token: str | None, **kwargs: Any) -> Any:
        client = HTTP_CLIENTS[kind](server.base_url, token, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def env(seq: int, type: str, channel: str = "SYSTEM", **payload: Any) -> dict[str, Any]:
    return {"id": f"e{seq}", "session": "", "seq": str(seq), "ts": "1", "type": type,
            "channel": channel, "payload": payload}


def ping(seq: int, nonce: str) -> dict[str, Any]:
    return env(seq, "PING", nonce=nonce)


def line(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def post(server: Any, path: str, body: bytes | str | Any, token: str | None,
         headers: dict[str, str] | None = None) -> requests.Response:
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    return requests.post(server.base_url + path, data=body, headers=all_headers,
                         timeout=timeout(5))


def http_error(resp: requests.Response) -> tuple[int, str]:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return resp.status_code, body["error"]["code"]


def active(server: Any) -> int:
    return server.get_stats()["activeConnections"]


def close_wait_sockets(port: int) -> list[str]:
    """Server-side sockets on ``port`` in CLOSE_WAIT (the peer closed, we did not)."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(name)
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            fields = row.split()
            local, state = fields[1], fields[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "08":
                found.append(row)
    return found


# -- SSE framing -----------------------------------------------------------------------


def test_sse_headers_and_session_event_without_id(server, token, clients):
    client = clients("sse", server, token, headers={"Accept-Encoding": "gzip, deflate"})
    h = client.headers
    assert h["content-type"].startswith("text/event-stream")
    assert h["cache-control"] == "no-cache"
    assert h["x-accel-buffering"] == "no"
    assert "content-encoding" not in h and "content-length" not in h
    assert h["transfer-encoding"] == "chunked"
    assert h["proto-session"] == client.session_id
    first = client.events[0]
    assert first["lines"] == ["event: session",
                              "data: " + json.dumps({"session": client.session_id},
                                                    separators=(",", ":"))]
    assert first["id"] is None
    assert server.get_session(client.session_id)["connected"] is True


def test_sse_protocol_messages_are_default_events_with_session_seq_ids(server, token,
                                                                       clients):
    client = clients("sse", server, token)
    client.hello()
    client.send("PING", "SYSTEM", {"nonce": "a"})
    client.recv_type("PONG", nonce="a")
    messages = [e for e in client.events if e["event"] == "message"]
    assert len(messages) == 2
    for event, msg in zip(messages, client.received, strict=True):
        assert event["lines"] == [f"id: {client.session_id}:{msg['seq']}",
                                  "data: " + event["data"]]
        assert orjson.loads(event["data"]) == msg
    assert client.last_event_id == f"{client.session_id}:2"


def test_sse_post_accepts_one_envelope_an_array_or_ndjson(server, token, clients):
    client = clients("sse", server, token)
    client.hello()
    resp = client.post(orjson.dumps(ping(2, "single")), headers={"Content-Type": "text/plain"})
    assert resp.status_code == 202 and resp.json() == {"accepted": 1}
    client.recv_type("PONG", nonce="single")
    resp = client.post(orjson.dumps([ping(3, "arr1"), ping(4, "arr2")]))
    assert resp.status_code == 202 and resp.json() == {"accepted": 2}
    resp = client.post(b"\r\n" + line(ping(5, "nd1")).replace(b"\n", b"\r\n") + b"\n\n"
                       + line(ping(6, "nd2")), headers={"Content-Type": "application/x-ndjson"})
    assert resp.status_code == 202 and resp.json() == {"accepted": 2}
    resp = client.post(orjson.dumps([]))
    assert resp.status_code == 202 and resp.json() == {"accepted": 0}
    pongs = [client.recv_type("PONG")["payload"]["nonce"] for _ in range(4)]
    assert pongs == ["arr1", "arr2", "nd1", "nd2"]


def test_sse_post_per_message_errors_arrive_on_the_stream(server, token, clients):
    client = clients("sse", server, token)
    client.hello()
    body = line(ping(2, "before")) + b"this line is not json\n" + line(ping(3, "after"))
    resp = client.post(body)
    assert resp.status_code == 202 and resp.json() == {"accepted": 3}
    resp = client.post(orjson.dumps([ping(4, "x"), {"not": "an envelope"}, 7, ping(5, "y")]))
    assert resp.status_code == 202 and resp.json() == {"accepted": 4}
    got = [(m["type"], m["payload"].get("nonce") or m["payload"].get("code"))
           for m in (client.recv() for _ in range(7))]
    assert got == [("PONG", "before"), ("ERROR", "INVALID_MESSAGE"), ("PONG", "after"),
                   ("PONG", "x"), ("ERROR", "INVALID_MESSAGE"), ("ERROR", "INVALID_MESSAGE"),
                   ("PONG", "y")]


def test_post_body_that_is_not_json_is_400_and_reported_on_the_stream(server, token,
                                                                       clients):
    client = clients("sse", server, token)
    client.hello()
    resp = client.post(b"hello there\nstill not json")
    assert http_error(resp) == (400, "INVALID_MESSAGE")
    client.expect_error("INVALID_MESSAGE")
    resp = client.post(b"")
    assert http_error(resp) == (400, "INVALID_MESSAGE")
    client.expect_error("INVALID_MESSAGE")
    client.send("PING", "SYSTEM", {"nonce": "alive"})
    client.recv_type("PONG", nonce="alive")


@pytest.mark.parametrize("endpoint", ["/proto/sse", "/proto/stream"])
def test_post_body_over_max_message_size_is_413(make_server, clients, endpoint):
    server = make_server(maxMessageSize=2048)
    token = server.issue_token("alice")
    client = clients("sse", server, token)
    client.hello()
    path = f"{endpoint}?session={client.session_id}"
    many = orjson.dumps([ping(10 + i, f"n{i}") for i in range(40)])  # each small, > 2048 total
    assert len(many) > 2048
    assert http_error(post(server, path, many, token)) == (413, "MESSAGE_TOO_LARGE")
    client.expect_error("MESSAGE_TOO_LARGE")
    chunked = (part for part in [many[:1000], many[1000:]])  # no Content-Length
    assert http_error(post(server, path, chunked, token)) == (413, "MESSAGE_TOO_LARGE")
    client.expect_error("MESSAGE_TOO_LARGE")
    exact = orjson.dumps(ping(100, "fits"))
    exact = exact[:-1] + b" " * (2048 - len(exact)) + b"}"
    assert post(server, path, exact, token).status_code == 202
    client.recv_type("PONG", nonce="fits")
    assert not [m for m in client.received if m["payload"].get("nonce", "").startswith("n")]


@pytest.mark.parametrize("endpoint", ["/proto/sse", "/proto/stream"])
def test_post_http_errors(server, token, clients, endpoint):
    client = clients("sse", server, token)
    client.hello()
    path = f"{endpoint}?session={client.session_id}"
    body = orjson.dumps(ping(2, "p"))
    assert http_error(post(server, path, body, None)) == (401, "MISSING_TOKEN")
    assert http_error(post(server, path, body, "not.a.jwt")) == (401, "INVALID_TOKEN")
    other = server.issue_token("mallory")
    assert http_error(post(server, path, body, other)) == (404, "SESSION_NOT_FOUND")
    assert http_error(post(server, f"{endpoint}?session=nope", body, token)) == \
        (404, "SESSION_NOT_FOUND")
    if endpoint == "/proto/stream":  # with last_seq the POST is a resume: same checks
        assert http_error(post(server, path + "&last_seq=x", body, token)) == \
            (400, "INVALID_MESSAGE")
        assert http_error(post(server, path + "&last_seq=1", body, other)) == \
            (404, "SESSION_NOT_FOUND")
    if endpoint == "/proto/sse":
        assert http_error(post(server, "/proto/sse", body, token)) == (400, "INVALID_MESSAGE")
    # none of the refused bodies reached the session
    client.send("PING", "SYSTEM", {"nonce": "only"})
    client.recv_type("PONG", nonce="only")
    assert [m["payload"]["nonce"] for m in client.received if m["type"] == "PONG"] == ["only"]


@pytest.mark.parametrize("kind", ["sse", "stream"])
def test_connection_http_errors(make_server, kind):
    server = make_server(maxConnections=1)
    token = server.issue_token("alice")
    path = "/proto/sse" if kind == "sse" else "/proto/stream"
    method = "GET" if kind == "sse" else "POST"
    hello = orjson.dumps(env(1, "HELLO", **hello_payload()))

    def refused(headers: dict[str, str], query: str = "") -> tuple[int, dict[str, Any]]:
        sock = open_http(server.base_url, method, path + query, headers,
                         None if kind == "sse" else hello)
        try:
            reader = HTTPResponseReader(sock)
            status, _ = reader.read_head()
            return status, orjson.loads(reader.read_body())
        finally:
            sock.close()

    assert refused({}) == (401, {"error": {"code": "MISSING_TOKEN",
                                           "message": "a token is required"}})
    status, body = refused({"Authorization": "Bearer nope"})
    assert (status, body["error"]["code"]) == (401, "INVALID_TOKEN")
    status, body = refused({"Authorization": "Basic dXNlcjpwdw=="})
    assert (status, body["error"]["code"]) == (401, "MISSING_TOKEN")
    with HTTP_CLIENTS[kind](server.base_url, token) as first:
        first.hello()
        status, body = refused({"Authorization": f"Bearer {token}"})
        assert (status, body["error"]["code"]) == (503, "MAX_CONNECTIONS")
    wait_for(lambda: active(server) == 0, what="the first connection to be gone")
    # the SSE upstream POST is not a live transport: it never counts against the limit
    with HTTP_CLIENTS[kind](server.base_url, token, headers={"X-Test": "1"}) as again:
        again.hello()


def test_sse_token_in_query_or_bearer(server, token, clients):
    by_header = clients("sse", server, None, headers={"Authorization": f"Bearer {token}"})
    assert server.get_session(by_header.session_id)["userId"] == "alice"
    with pytest.raises(HTTPRefused) as info:
        clients("sse", server, "bad")
    assert info.value.status == 401 and info.value.json()["error"]["code"] == "INVALID_TOKEN"


# -- SSE resume ------------------------------------------------------------------------


def _session_with_history(server: Any, token: str, clients: Any,
                          transport: str = "sse") -> tuple[str, Envelopes]:
    """A session that saw HELLO (1) and PONG (2), then lost its stream and got message 3
    while disconnected."""
    first = clients(transport, server, token)
    first.hello()
    first.send("PING", "SYSTEM", {"nonce": "p"})
    first.recv_type("PONG")
    sid = first.session_id
    first.close()
    wait_for(lambda: not server.get_session(sid)["connected"], what="disconnect noticed")
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": "while-away",
                                          "content_type": "text/plain"}})
    return sid, first.envelopes


def test_sse_resume_with_last_event_id(server, token, clients):
    sid, envelopes = _session_with_history(server, token, clients)
    resumed = clients("sse", server, token, headers={"Last-Event-ID": f"{sid}:1"})
    assert resumed.session_id == sid
    assert resumed.events[0]["event"] == "session" and resumed.events[0]["id"] is None
    replay = [resumed.recv(), resumed.recv()]
    assert [(m["seq"], m["type"]) for m in replay] == [("2", "PONG"), ("3", "MESSAGE_START")]
    assert [e["id"] for e in resumed.events[1:3]] == [f"{sid}:2", f"{sid}:3"]
    # the session goes on: handshake kept, upstream seq continues
    resumed.envelopes = Envelopes(start=envelopes.last_seq + 1)
    resumed.send("PING", "SYSTEM", {"nonce": "back"})
    assert resumed.recv()["payload"] == {"nonce": "back"}
    assert server.get_session(sid)["handshakeCompleted"] is True


def test_sse_resume_with_query_and_header_precedence(server, token, clients):
    sid, _ = _session_with_history(server, token, clients)
    by_query = clients("sse", server, token, session=sid, last_seq=2)
    assert by_query.recv()["seq"] == "3"
    by_query.close()
    wait_for(lambda: not server.get_session(sid)["connected"], what="disconnect noticed")
    # a browser reconnecting to the same URL sends its newer Last-Event-ID: it wins
    both = clients("sse", server, token, session=sid, last_seq=0,
                   headers={"Last-Event-ID": f"{sid}:2"})
    assert both.recv()["seq"] == "3"


def test_sse_resume_refusals(server, token, clients):
    sid, _ = _session_with_history(server, token, clients)
    other = server.issue_token("mallory")
    for kwargs, expected in [
        ({"headers": {"Last-Event-ID": f"{sid}:1"}, "token": other}, (404, "SESSION_NOT_FOUND")),
        ({"session": sid, "token": other}, (404, "SESSION_NOT_FOUND")),
        ({"headers": {"Last-Event-ID": "nosuchsession:4"}}, (404, "SESSION_NOT_FOUND")),
        ({"headers": {"Last-Event-ID": "garbage"}}, (400, "INVALID_MESSAGE")),
        ({"session": sid, "last_seq": "-1"}, (400, "INVALID_MESSAGE")),
    ]:
        tok = kwargs.pop("token", token)
        with pytest.raises(HTTPRefused) as info:
            clients("sse", server, tok, **kwargs)
        assert (info.value.status, info.value.json()["error"]["code"]) == expected, kwargs
    assert server.get_session(sid)["connected"] is False


def test_sse_superseded_stream_ends_with_close_event(server, token, clients):
    first = clients("sse", server, token)
    first.hello()
    second = clients("sse", server, token, session=first.session_id)
    first.wait_ended()
    assert first.close_code == 4002
    assert first.events[-1]["event"] == "close" and first.events[-1]["id"] is None
    second.envelopes = Envelopes(start=2)
    second.send("PING", "SYSTEM", {"nonce": "new"})
    second.recv_type("PONG", nonce="new")
    assert active(server) == 1


def test_sse_idle_stream_gets_keepalive_comments(make_server, clients):
    server = make_server(heartbeatInterval=150, heartbeatTimeout=60000)
    client = clients("sse", server, server.issue_token("u"))
    wait_for(lambda: "keepalive" in client.comments, what="a keep-alive comment")


def test_server_stop_ends_streams(make_server, clients):
    server = make_server()
    token = server.issue_token("u")
    sse = clients("sse", server, token)
    sse.hello()
    stream = clients("stream", server, token)
    stream.hello()
    server.stop()
    sse.wait_ended()
    stream.wait_ended()
    assert sse.close_code == 1001


# -- stream ----------------------------------------------------------------------------


def test_stream_head_and_first_line_is_the_hello_reply(server, token, clients):
    client = clients("stream", server, token, headers={"Accept-Encoding": "gzip"})
    reply = client.hello()
    status, h = client.response_head()
    assert status == 200
    assert h["content-type"] == "application/x-ndjson"
    assert h["proto-session"] == reply["payload"]["session"] == client.session_id
    assert h["cache-control"] == "no-cache" and h["x-accel-buffering"] == "no"
    assert "content-encoding" not in h and h["transfer-encoding"] == "chunked"
    assert "Proto-Session" in h["access-control-expose-headers"].split(", ")
    assert orjson.loads(client.lines[0]) == reply


def test_stream_single_json_body_and_response_outlives_it(server, token):
    hello = orjson.dumps(env(1, "HELLO", **hello_payload()))  # one object, no newline
    sock = open_http(server.base_url, "POST", "/proto/stream",
                     {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                     hello)
    try:
        reader = HTTPResponseReader(sock)
        assert reader.read_head()[0] == 200
        sid = reader.headers["proto-session"]
        body = reader.iter_body()
        first = orjson.loads(next(body))
        assert first["type"] == "HELLO" and first["session"] == sid
        # the request body is complete; the response is still the session's downstream
        resp = post(server, f"/proto/stream?session={sid}", line(ping(2, "follow-up")), token)
        assert resp.status_code == 202 and resp.json() == {"accepted": 1}
        assert orjson.loads(next(body))["payload"] == {"nonce": "follow-up"}
        server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                                  "payload": {"message_id": "app", "content_type": "x"}})
        assert orjson.loads(next(body))["payload"]["message_id"] == "app"
        assert active(server) == 1
    finally:
        sock.close()


def test_stream_lines_split_across_chunks(server, token, clients):
    client = clients("stream", server, token)
    hello = line(env(1, "HELLO", **hello_payload()))
    client.send_chunk(hello[:10])
    client.send_chunk(hello[10:50])
    client.send_chunk(hello[50:-1])
    client.send_chunk(b"\r\n")
    assert client.recv()["type"] == "HELLO"
    two_and_a_half = line(ping(2, "a")) + line(ping(3, "b")) + line(ping(4, "c"))[:20]
    client.send_chunk(two_and_a_half)
    client.send_chunk(line(ping(4, "c"))[20:] + b"\n\n")  # blank lines are skipped
    assert [client.recv()["payload"]["nonce"] for _ in range(3)] == ["a", "b", "c"]


def test_stream_bad_line_gets_its_error_and_the_rest_continue(server, token, clients):
    client = clients("stream", server, token)
    client.hello()
    client.send_chunk(b"garbage\n" + line(ping(2, "one")) + b'{"seq": 3}\n'
                      + line(env(4, "TELEPORT")) + line(ping(5, "two")))
    got = [(m["type"], m["payload"].get("nonce") or m["payload"].get("code"))
           for m in (client.recv() for _ in range(5))]
    assert got == [("ERROR", "INVALID_MESSAGE"), ("PONG", "one"), ("ERROR", "INVALID_MESSAGE"),
                   ("ERROR", "UNSUPPORTED_TYPE"), ("PONG", "two")]
    assert client.received[4]["payload"]["related_id"] == "e4"


def test_stream_line_over_limit_ends_response_and_keeps_session(make_server, clients):
    server = make_server(maxMessageSize=1024)
    token = server.issue_token("alice")
    client = clients("stream", server, token)
    client.hello()
    big = line(env(2, "PING", nonce="x" * 3000))
    client.send_chunk(big[:700])
    client.send_chunk(big[700:] + line(ping(3, "never")))
    err = client.expect_error("MESSAGE_TOO_LARGE")
    client.wait_ended(within=0.9)  # before the server's linger: the response ends at once
    with pytest.raises(StreamEnded):
        client.recv(within=0.1)
    sid = client.session_id
    wait_for(lambda: active(server) == 0, what="the stream to be counted out")
    assert server.get_session(sid)["connected"] is False
    resumed = clients("stream", server, token, session=sid, last_seq=err["seq"])
    resumed.envelopes = Envelopes(start=3)
    resumed.send("PING", "SYSTEM", {"nonce": "resumed"})
    assert resumed.recv()["payload"] == {"nonce": "resumed"}
    assert not [m for m in client.received + resumed.received
                if m["payload"].get("nonce") == "never"]


def test_stream_unsupported_version_is_200_error_line_then_end(server, token, clients):
    client = clients("stream", server, token)
    client.send("HELLO", "SYSTEM", hello_payload(proto_version="9.0.0", accept_major=[9]))
    err = client.expect_error("UNSUPPORTED_VERSION")
    client.wait_ended()
    assert client.response_head()[0] == 200
    assert [orjson.loads(raw) for raw in client.lines] == [err]


def test_stream_follow_up_posts(server, token, clients):
    client = clients("stream", server, token)
    client.hello()
    path = f"/proto/stream?session={client.session_id}"
    resp = post(server, path, line(ping(2, "p1")) + line(ping(3, "p2")), token,
                {"Content-Type": "text/plain"})
    assert resp.status_code == 202 and resp.json() == {"accepted": 2}
    resp = post(server, path, orjson.dumps([ping(4, "p3")]), token)
    assert resp.status_code == 202 and resp.json() == {"accepted": 1}
    assert [client.recv()["payload"]["nonce"] for _ in range(3)] == ["p1", "p2", "p3"]
    assert active(server) == 1  # follow-ups are not live transports


def test_stream_resume_by_post_with_last_seq(server, token, clients):
    sid, _ = _session_with_history(server, token, clients, "stream")
    resumed = clients("stream", server, token, session=sid, last_seq=1)
    assert [resumed.recv()["seq"] for _ in range(2)] == ["2", "3"]
    assert resumed.response_head()[1]["proto-session"] == sid
    resumed.envelopes = Envelopes(start=3)  # its body is upstream, no HELLO needed
    resumed.send("PING", "SYSTEM", {"nonce": "again"})
    assert resumed.recv()["payload"] == {"nonce": "again"}
    with pytest.raises(HTTPRefused) as info:
        clients("stream", server, server.issue_token("mallory"), session=sid,
                last_seq=0).recv()
    assert info.value.status == 404


def test_stream_request_body_end_keeps_the_downstream(server, token, clients):
    client = clients("stream", server, token)
    client.hello()
    client.end_body()
    resp = post(server, f"/proto/stream?session={client.session_id}", line(ping(2, "later")),
                token)
    assert resp.status_code == 202
    assert client.recv()["payload"] == {"nonce": "later"}
    assert active(server) == 1 and not client.ended.is_set()


# -- clients going away ------------------------------------------------------------------


def _raw_live_connection(server: Any, token: str, kind: str,
                         rcvbuf: int | None = None) -> tuple[socket.socket, str]:
    """A live SSE or stream connection on a socket no other thread reads."""
    if kind == "sse":
        sock = open_http(server.base_url, "GET", f"/proto/sse?token={token}", rcvbuf=rcvbuf)
    else:
        sock = open_http(server.base_url, "POST", "/proto/stream", {
            "Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"},
            rcvbuf=rcvbuf)
        sock.sendall(chunk(line(env(1, "HELLO", **hello_payload()))))
    reader = HTTPResponseReader(sock)
    assert reader.read_head()[0] == 200
    next(reader.iter_body())  # the session event / the HELLO reply
    return sock, reader.headers["proto-session"]


@pytest.mark.parametrize("kind,how", [
    ("sse", "close"), ("sse", "reset"),
    ("stream", "close"), ("stream", "reset"), ("stream", "close-after-body"),
])
def test_client_going_away_is_noticed(server, token, kind, how):
    """With the default 30 s heartbeat, only noticing the socket itself passes this."""
    gone: queue.Queue = queue.Queue()
    server.on("disconnect", gone.put)
    sock, sid = _raw_live_connection(server, token, kind)
    try:
        if how == "close-after-body":  # the body is complete: the socket is watched
            sock.sendall(b"0\r\n\r\n")
        assert active(server) == 1 and server.get_session(sid)["connected"] is True
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()
    assert gone.get(timeout=timeout(3)) == sid
    wait_for(lambda: active(server) == 0, within=3, what="activeConnections back to 0")
    assert server.get_session(sid)["connected"] is False
    wait_for(lambda: not close_wait_sockets(server.port), within=3,
             what="no server socket left in CLOSE_WAIT")


def test_frozen_readers_are_cut_by_the_outbound_bound(make_server):
    """A client that stops reading its SSE / NDJSON response blocks the server's write;
    the session's outbound bound (outboundBufferSize) drops that connection, the session is
    kept for resume, and the connection slot is given back."""
    server = make_server(outboundBufferSize=128 * 1024)
    gone: queue.Queue = queue.Queue()
    server.on("disconnect", gone.put)
    token = server.issue_token("u")
    frozen = {}
    for kind in ("sse", "stream"):
        sock, sid = _raw_live_connection(server, token, kind, rcvbuf=4096)
        frozen[sid] = sock
    try:
        assert active(server) == 2
        cut: set[str] = set()
        part = {"type": "MESSAGE_PART", "channel": "AGENT",
                "payload": {"message_id": "flood", "content": "z" * 16384}}
        for _ in range(2000):  # ~32 MB at most; the bound is hit long before
            for sid in set(frozen) - cut:
                server.send_message(sid, part)
            while not gone.empty():
                cut.add(gone.get())
            if cut == set(frozen):
                break
        assert cut == set(frozen)
        wait_for(lambda: active(server) == 0, within=5, what="both slots given back")
        for sid in frozen:
            snapshot = server.get_session(sid)
            assert snapshot is not None and snapshot["connected"] is False
            assert snapshot["outboundBytes"] <= 128 * 1024 + 64 * 1024
    finally:
        for sock in frozen.values():
            sock.close()


# -- CORS ------------------------------------------------------------------------------


def test_cors_preflight_allows_last_event_id(server):
    resp = requests.options(server.base_url + "/proto/sse", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "last-event-id"}, timeout=timeout(5))
    assert resp.status_code == 200
    assert "Last-Event-ID" in resp.headers["Access-Control-Allow-Headers"]
    assert resp.headers["Access-Control-Allow-Origin"] == "http://app.example"


# -- gunicorn -k gevent ------------------------------------------------------------------


@pytest.fixture(scope="module")
def gunicorn_server() -> Iterator[GunicornServer]:
    server = GunicornServer()
    try:
        yield server
    finally:
        server.stop()


def test_sse_and_stream_under_gunicorn(gunicorn_server, clients):
    from protoflask.auth import TokenAuthority

    token = TokenAuthority(SECRET).issue("g")

    def stats() -> dict[str, Any]:
        return requests.get(gunicorn_server.base_url + "/stats", timeout=timeout(5)).json()

    sse = clients("sse", gunicorn_server, token)
    sse.hello()
    sse.send("TOOL_CALL", payload={"call_id": "t", "tool": "add", "params": {"a": 1, "b": 2}})
    assert sse.recv_type("TOOL_DONE")["payload"]["result"] == {"result": 3}
    sse.send_raw("not json")
    sse.expect_error("INVALID_MESSAGE")

    stream = clients("stream", gunicorn_server, token)
    hello = line(env(1, "HELLO", **hello_payload()))
    stream.send_chunk(hello[:30])
    stream.send_chunk(hello[30:])
    assert stream.recv()["type"] == "HELLO"
    stream.send_chunk(line(ping(2, "g1")) + line(ping(3, "g2"))[:15])
    assert stream.recv()["payload"] == {"nonce": "g1"}  # before the rest of line 3 exists
    stream.send_chunk(line(ping(3, "g2"))[15:])
    assert stream.recv()["payload"] == {"nonce": "g2"}
    resp = requests.post(gunicorn_server.base_url + f"/proto/stream?session={stream.session_id}",
                         data=line(ping(4, "g3")), headers={"Authorization": f"Bearer {token}"},
                         timeout=timeout(5))
    assert resp.status_code == 202
    assert stream.recv()["payload"] == {"nonce": "g3"}
    assert stats()["activeConnections"] == 2

    sse.close()
    stream.close()
    wait_for(lambda: stats()["activeConnections"] == 0, within=3,
             what="gunicorn noticing both clients going away")
    wait_for(lambda: not close_wait_sockets(gunicorn_server.port), within=3,
             what="no CLOSE_WAIT under gunicorn")


def test_idle_timeout_never_writes_a_message_twice(make_server, clients):
    """Regression: a keep-alive wait that timed out used to re-send the last chunk."""
    server = make_server(heartbeatInterval=100, heartbeatTimeout=60000)
    client = clients("sse", server, server.issue_token("u"))
    client.hello()
    for _ in range(6):  # answer each PING so the next one comes
        ping = client.recv_type("PING", within=3)
        client.send("PONG", "SYSTEM", {"nonce": ping["payload"]["nonce"]})
    seqs = [m["seq"] for m in client.received]
    assert len(seqs) == len(set(seqs)), seqs
    assert [int(s) for s in seqs] == list(range(1, len(seqs) + 1))
