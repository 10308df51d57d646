"""A caught-up stream resume answers its head at once (docs/PROTOCOL.md, HTTP streaming).

``POST /proto/stream?session=<id>&last_seq=<the last seq>`` with an open chunked body: the
replay window holds nothing newer, so no message is there to carry the status line. A
client that waits for the head before it writes (curl, browsers' fetch with a streaming
body, most HTTP libraries) used to wait forever. The client here sends the request head
only, without ``Expect: 100-continue``, and waits for the response head before writing
a single body byte; then the stream must work both ways.

Both servers: gunicorn's gevent worker and the embedded gevent.pywsgi server (which skips
empty body chunks, so it needs its own care). Heartbeats are far off, so no PING can
carry the head by chance.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator

import orjson
import pytest

from protoflask.auth import TokenAuthority

from ..support import (
    SECRET, GunicornServer, HTTPResponseReader, StreamClient, chunk, hello_payload, open_http,
    timeout,
)

QUIET = {"heartbeatInterval": 600000, "heartbeatTimeout": 600000}


@pytest.fixture(params=["embedded", "gunicorn"])
def any_server(request: pytest.FixtureRequest, make_server: Any) -> Iterator[Any]:
    if request.param == "embedded":
        yield make_server(**QUIET)
        return
    server = GunicornServer(env={"HEARTBEAT_INTERVAL": "600000",
                                 "HEARTBEAT_TIMEOUT": "600000"})
    try:
        yield server
    finally:
        server.stop()


def _line(seq: int, type: str, channel: str, **payload: Any) -> bytes:
    return orjson.dumps({"id": f"r{seq}", "session": "", "seq": str(seq), "ts": "1",
                         "type": type, "channel": channel, "payload": payload}) + b"\n"


def test_caught_up_stream_resume_answers_its_head_before_any_body(any_server):
    token = TokenAuthority(SECRET).issue("resumer")
    first = StreamClient(any_server.base_url, token)
    try:
        first.hello()
        last = max(int(m["seq"]) for m in first.received)
        sid = first.session_id
    finally:
        first.close()

    sock = open_http(any_server.base_url, "POST",
                     f"/proto/stream?session={sid}&last_seq={last}",
                     {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked",
                      "Content-Type": "application/x-ndjson"})
    try:
        sock.settimeout(timeout(5))
        reader = HTTPResponseReader(sock)
        try:
            status, headers = reader.read_head()  # not one body byte written yet
        except socket.timeout:
            pytest.fail("a caught-up resume sent no status line before the client wrote")
        assert status == 200
        assert headers["proto-session"] == sid
        assert headers["content-type"].startswith("application/x-ndjson")

        # and the stream is live both ways: no HELLO needed, a PING gets its PONG
        sock.sendall(chunk(_line(2, "PING", "SYSTEM", nonce="after-head")))
        body = reader.iter_body()
        pending = b""
        while b"\n" not in pending:
            pending += next(body)
        reply = orjson.loads(pending.split(b"\n", 1)[0])
        assert reply["type"] == "PONG" and reply["payload"] == {"nonce": "after-head"}
        assert int(reply["seq"]) == last + 1  # nothing was replayed: it was caught up
    finally:
        sock.close()


def test_new_stream_head_comes_before_the_hello(any_server):
    """The same for a new stream: its head does not wait for the HELLO reply either."""
    token = TokenAuthority(SECRET).issue("starter")
    sock = open_http(any_server.base_url, "POST", "/proto/stream",
                     {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"})
    try:
        sock.settimeout(timeout(5))
        reader = HTTPResponseReader(sock)
        try:
            status, headers = reader.read_head()
        except socket.timeout:
            pytest.fail("a new stream sent no status line before the client wrote its HELLO")
        assert status == 200 and headers["proto-session"]
        sock.sendall(chunk(_line(1, "HELLO", "SYSTEM", **hello_payload())))
        body = reader.iter_body()
        pending = b""
        while b"\n" not in pending:
            pending += next(body)
        assert orjson.loads(pending.split(b"\n", 1)[0])["type"] == "HELLO"
    finally:
        sock.close()
