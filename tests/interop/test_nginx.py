"""The recommended nginx configuration (deploy/nginx/protoflask.conf, as written: only its
upstream address, listen port and log path are swapped for the test's own) in front of
gunicorn, carrying all three transports: the WebSocket upgrade, SSE unbuffered, the
full-duplex NDJSON stream (each answer read before the next line is written), and the
resumes (SSE by Last-Event-ID, a caught-up stream resume whose head must come back
before the client writes). nginx runs as a plain process of the test (no master, no
daemon) with a prefix and config of its own; the access log must not record tokens.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator

import orjson
import pytest
import requests

from protoflask.auth import TokenAuthority

from ..support import (
    SECRET, Envelopes, GunicornServer, HTTPResponseReader, SSEClient, StreamClient,
    WSClient, chunk, open_http, timeout,
)
from ..nginx import Nginx
from .conftest import need_program


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    nginx = need_program("nginx", "nginx")
    backend = GunicornServer(env={"HEARTBEAT_INTERVAL": "600000",
                                  "HEARTBEAT_TIMEOUT": "600000"})
    try:
        proxy = Nginx(nginx, [backend.port], tmp_path_factory.mktemp("nginx"))
        try:
            yield proxy
        finally:
            proxy.stop()
    finally:
        backend.stop()


@pytest.fixture
def token() -> str:
    return TokenAuthority(SECRET).issue("behind-nginx")


def test_websocket_through_nginx(proxied, token):
    with WSClient(proxied.base_url, token) as ws:
        ws.hello()
        ws.send("TOOL_CALL", payload={"call_id": "n", "tool": "add",
                                      "params": {"a": 1, "b": 41}})
        assert ws.recv_type("TOOL_DONE")["payload"]["result"] == {"result": 42}
        sid, last = ws.session_id, int(ws.received[-1]["seq"])
        next_seq = ws.envelopes.last_seq + 1
    with WSClient(proxied.base_url, token, session=sid, last_seq=last) as resumed:
        resumed.envelopes = Envelopes(start=next_seq)
        resumed.send("PING", "SYSTEM", {"nonce": "again"})
        pong = resumed.recv_type("PONG")
        assert int(pong["seq"]) == last + 1
    assert token not in proxied.access_log.read_text()


def test_sse_unbuffered_and_last_event_id_resume_through_nginx(proxied, token):
    sse = SSEClient(proxied.base_url, token)  # the session event: nothing else was sent
    try:
        assert sse.headers.get("x-accel-buffering") is None  # nginx consumed it
        sse.hello()
        sse.send("PING", "SYSTEM", {"nonce": "live"})
        assert sse.recv_type("PONG")["payload"] == {"nonce": "live"}
        sid, last_id = sse.session_id, sse.last_event_id
    finally:
        sse.close()
    # while away: a PING posted, its PONG waits in the replay window
    resp = requests.post(f"{proxied.base_url}/proto/sse?session={sid}",
                         data=orjson.dumps({"id": "p", "session": sid, "seq": "4", "ts": "1",
                                            "type": "PING", "channel": "SYSTEM",
                                            "payload": {"nonce": "away"}}),
                         headers={"Authorization": f"Bearer {token}"}, timeout=timeout(5))
    assert resp.status_code == 202
    resumed = SSEClient(proxied.base_url, token, headers={"Last-Event-ID": last_id})
    try:
        assert resumed.session_id == sid
        pong = resumed.recv_type("PONG")
        assert pong["payload"] == {"nonce": "away"}
        assert resumed.last_event_id == f"{sid}:{int(last_id.split(':')[1]) + 1}"
    finally:
        resumed.close()
    assert token not in proxied.access_log.read_text()


def test_duplex_ndjson_stream_through_nginx(proxied, token):
    stream = StreamClient(proxied.base_url, token)
    try:
        stream.hello()  # the HELLO reply came back while the request body is still open
        for n in range(3):
            stream.send("PING", "SYSTEM", {"nonce": f"d{n}"})
            assert stream.recv_type("PONG")["payload"] == {"nonce": f"d{n}"}
        stream.send("TOOL_CALL", payload={"call_id": "s", "tool": "echo",
                                          "params": {"message": "via nginx"}})
        assert stream.recv_type("TOOL_DONE")["payload"]["result"] == {"echoed": "via nginx"}
        sid, last = stream.session_id, max(int(m["seq"]) for m in stream.received)
        next_seq = stream.envelopes.last_seq + 1
    finally:
        stream.close()

    # a caught-up resume: the head must come back through nginx before a body byte
    sock = open_http(proxied.base_url, "POST", f"/proto/stream?session={sid}&last_seq={last}",
                     {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked",
                      "Content-Type": "application/x-ndjson"})
    try:
        reader = HTTPResponseReader(sock)
        try:
            status, headers = reader.read_head()
        except socket.timeout:
            pytest.fail("no head through nginx for a caught-up resume")
        assert status == 200 and headers["proto-session"] == sid
        sock.sendall(chunk(orjson.dumps({"id": "r", "session": sid, "seq": str(next_seq),
                                         "ts": "1", "type": "PING", "channel": "SYSTEM",
                                         "payload": {"nonce": "resumed"}}) + b"\n"))
        body = reader.iter_body()
        pending = b""
        while b"\n" not in pending:
            pending += next(body)
        pong: dict[str, Any] = orjson.loads(pending.split(b"\n", 1)[0])
        assert pong["payload"] == {"nonce": "resumed"} and int(pong["seq"]) == last + 1
    finally:
        sock.close()


def test_plain_get_on_the_websocket_route_explains_itself_through_nginx(proxied):
    resp = requests.get(f"{proxied.base_url}/proto/websocket", timeout=timeout(5))
    assert resp.status_code == 426
    assert resp.json()["error"]["code"] == "UPGRADE_REQUIRED"


def test_a_duplex_body_of_several_mib_through_nginx(proxied, token):
    """A duplex stream's request body is the session's whole upstream: nginx's
    client_max_body_size (1 MiB by default) must not cut it."""
    pad = "x" * 65536
    stream = StreamClient(proxied.base_url, token)
    try:
        stream.hello()
        for n in range(80):  # 5 MiB upstream in one request body (the echo tool's
            # params: a PING nonce is capped at 256 characters)
            stream.send("TOOL_CALL", "USER", {"call_id": f"c{n}", "tool": "echo",
                                              "params": {"message": f"{n}:{pad}"}})
            done = stream.recv_type("TOOL_DONE")["payload"]
            assert done["call_id"] == f"c{n}" and done["result"] == {"echoed": f"{n}:{pad}"}
    finally:
        stream.close()


@pytest.mark.parametrize("path", ["/proto/stream", "/proto/sse"])
def test_a_2_mib_post_gets_the_servers_json_413_through_nginx(proxied, token, path):
    """Too large for maxMessageSize (1 MiB): the answer is protoflask's own JSON error,
    not an nginx HTML page."""
    stream = StreamClient(proxied.base_url, token)
    try:
        stream.hello()
        sid = stream.session_id
        line = orjson.dumps({"id": "big", "session": sid, "seq": "2", "ts": "1",
                             "type": "PING", "channel": "SYSTEM",
                             "payload": {"nonce": "y" * (2 << 20)}})
        resp = requests.post(f"{proxied.base_url}{path}?session={sid}", data=line,
                             headers={"Authorization": f"Bearer {token}",
                                      "Content-Type": "application/x-ndjson"},
                             timeout=timeout(20))
        assert resp.status_code == 413, resp.text[:300]
        assert resp.headers["content-type"].startswith("application/json"), resp.text[:300]
        assert resp.json()["error"]["code"] == "MESSAGE_TOO_LARGE"
        # nothing of it reached the session, which still works
        stream.send("PING", "SYSTEM", {"nonce": "after"})
        assert stream.recv_type("PONG")["payload"] == {"nonce": "after"}
    finally:
        stream.close()
