"""One user must never cost everyone (issue 13, items 4 and 6): per-user caps on live
transports, kept sessions and POST bodies, deadlines on request bodies, and gunicorn
headroom that keeps /health and new connections answering under slow clients. Each test
runs against the embedded server and gunicorn where the WSGI server matters."""

from __future__ import annotations

import socket

import orjson
import pytest

from protoflask.auth import TokenAuthority

from ..hardening_support import Live, call_endpoint, error_code, request, vitals
from ..support import (
    SECRET, GunicornServer, HTTPRefused, SSEClient, StreamClient, WSClient, open_http, timeout,
    wait_for,
)

CLIENT_OF = {"websocket": WSClient, "sse": SSEClient, "stream": StreamClient}


def token_for(user: str) -> str:
    return TokenAuthority(SECRET).issue(user)


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, maxConnections=50, maxConnectionsPerUser=3,
                  maxKeptSessionsPerUser=2, bodyTimeout=600, replayWindowTime=60000)
    try:
        yield server
    finally:
        server.stop()


def refusal(base_url: str, name: str, token: str, **kwargs) -> str | None:
    status, _, body = call_endpoint(base_url, name, token, **kwargs)
    assert status == 503, (name, status, body)
    return error_code(body)


def test_one_user_cannot_take_every_connection(live):
    """docs/PROTOCOL.md §1.4: up to maxConnectionsPerUser live transports, then 503
    USER_CONNECTION_LIMIT on every transport, while another user still connects; a resume
    that supersedes a transport of the same session is not counted twice."""
    token = live.token("greedy")
    held = [cls(live.base_url, token) for cls in CLIENT_OF.values()]
    try:
        for client in held:
            client.hello()
        for name in ("websocket", "sse", "stream"):
            assert refusal(live.base_url, name, token) == "USER_CONNECTION_LIMIT", name
        with WSClient(live.base_url, live.token("someone-else")) as other:
            other.hello()
        # the WebSocket's session resumed over SSE: it replaces that transport
        resumed = SSEClient(live.base_url, token, session=held[0].session_id)
        held.append(resumed)
        wait_for(lambda: vitals(live.base_url)["activeConnections"] == 3,
                 what="the superseded WebSocket to close")
        assert refusal(live.base_url, "sse", token) == "USER_CONNECTION_LIMIT"
        # one goes, one more gets in
        held.pop(1).close()
        wait_for(lambda: vitals(live.base_url)["activeConnections"] == 2, what="the slot back")
        held.append(WSClient(live.base_url, token))
    finally:
        for client in held:
            client.close()
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="all closed")


def test_the_oldest_disconnected_session_of_a_user_goes_first(live):
    token = live.token("hoarder")
    sessions = []
    for _ in range(3):
        with WSClient(live.base_url, token) as client:
            client.hello()
            sessions.append(client.session_id)
        wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="the close")
    # maxKeptSessionsPerUser=2: the first is gone, the two newest resume
    with pytest.raises(Exception) as gone:
        WSClient(live.base_url, token, session=sessions[0])
    assert "404" in str(gone.value)
    for sid in sessions[1:]:
        with WSClient(live.base_url, token, session=sid) as client:
            client.hello()
            assert client.session_id == sid
    # another user's sessions are not touched by this one's
    with WSClient(live.base_url, live.token("bystander")) as other:
        other.hello()


def slow_post(base_url: str, token: str, path: str = "/proto/sse?session=nosuch",
              length: int = 1000) -> socket.socket:
    """A POST whose head is sent and whose body never comes."""
    return open_http(base_url, "POST", path, {"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json",
                                              "Content-Length": str(length)})


def read_response(sock: socket.socket) -> tuple[int, dict]:
    sock.settimeout(timeout(10))
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        more = sock.recv(65536)
        if not more:
            break
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():  # one JSON chunk
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    return int(head.split(b" ", 2)[1]), orjson.loads(body[body.index(b"{"):])


def test_a_body_that_does_not_arrive_in_time_is_408(live):
    """bodyTimeout: a POST body is read within it, or 408 REQUEST_TIMEOUT (JSON)."""
    for path in ("/proto/sse?session=nosuch", "/proto/stream?session=nosuch"):
        sock = slow_post(live.base_url, live.token("slow"), path)
        try:
            sock.sendall(b"[")  # a little of it, then nothing more
            status, body = read_response(sock)
        finally:
            sock.close()
        assert (status, body["error"]["code"]) == (408, "REQUEST_TIMEOUT"), (path, body)


def test_post_bodies_being_read_are_capped_per_user(live):
    """A user's POST bodies in flight have their own cap (maxConnectionsPerUser)."""
    token = live.token("trickler")
    socks = [slow_post(live.base_url, token) for _ in range(3)]
    try:
        wait_for(lambda: call_endpoint(live.base_url, "sse-post", token)[0] == 503,
                 what="the fourth body to be refused")
        status, _, body = call_endpoint(live.base_url, "sse-post", token)
        assert (status, error_code(body)) == (503, "USER_CONNECTION_LIMIT")
        # another user's POST is read as usual (no such session: 404)
        status, _, body = call_endpoint(live.base_url, "sse-post", live.token("other"))
        assert (status, error_code(body)) == (404, "SESSION_NOT_FOUND")
    finally:
        for sock in socks:
            sock.close()


def test_a_stream_body_stalled_inside_a_line_ends_its_response(live):
    """The duplex stream: idle between lines is fine, but a partial line that stalls for
    bodyTimeout ends the response; the session stays for resume."""
    token = live.token("staller")
    client = StreamClient(live.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        client.send_chunk(b'{"id": "half", "type": "PI')  # and never the rest
        wait_for(client.ended.is_set, within=10, what="the response to end")
        assert not isinstance(client.error, HTTPRefused)
    finally:
        client.close()
    with StreamClient(live.base_url, token, session=sid, last_seq=0) as resumed:
        resumed.response_head()
        assert resumed.session_id == sid


def test_slow_bodies_and_a_header_slowloris_do_not_starve_health():
    """Issue 13 item 4 under gunicorn with default sizes: 1200 authenticated POSTs whose
    bodies never come (12 users, 100 each: within maxConnectionsPerUser) and 600
    connections stuck in their headers. /health and a new SSE stream still answer (a
    refused or unanswered connection fails: gunicorn's 1100 worker_connections of old)."""
    server = GunicornServer(env={"BODY_TIMEOUT": "120000"})
    held: list[socket.socket] = []
    try:
        for i in range(1200):
            held.append(slow_post(server.base_url, token_for(f"attacker{i % 12}")))
        host, port = server.base_url.split("//")[1].split(":")
        for _ in range(600):
            sock = socket.create_connection((host, int(port)), timeout=timeout(5))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            held.append(sock)
        status, _, body = request(server.base_url, "GET", "/health")
        assert status == 200, body
        with SSEClient(server.base_url, token_for("bystander")) as client:
            client.hello()
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_hello_announces_connect_tickets(live):
    with WSClient(live.base_url, live.token("caps")) as client:
        assert client.hello()["payload"]["capabilities"]["connect_ticket"] is True


def test_a_resume_keeps_counting_once(live):
    """Resuming a connected session again and again never leaks a count."""
    token = live.token("resumer")
    with WSClient(live.base_url, token) as first:
        first.hello()
        sid = first.session_id
        for _ in range(5):
            WSClient(live.base_url, token, session=sid).close()
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="all closed")
    held = [WSClient(live.base_url, token) for _ in range(3)]
    for client in held:
        client.close()

