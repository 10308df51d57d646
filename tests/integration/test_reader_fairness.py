"""One client that never pauses cannot keep the worker to itself.

A client writes PINGs without a break, and reads what comes back, so no write of the
server's ever waits. It writes them on a WebSocket, as the chunked body of a duplex HTTP
stream, or as keep-alive POSTs sent without waiting for their answers; with the default
rate limit (the excess is refused, but still read) and with none. Its reader always
finds bytes to read, yet takes turns with every other greenlet: the WebSocket's waits on
the socket's watcher before each read (``transports/sockets.read_wait``), the stream's
yields before each piece of its body (``transports/request_body.taking_turns``), and
every request starts with a turn (protoflask.gunicorn_worker's ``handle_request``, the embedded
server's handler). So a second client connects, shakes hands and gets its PONG while
the flood is still going. A reader that read again as long as bytes were there kept the
worker until the flood stopped (the second client's handshake timed out).
"""

from __future__ import annotations

import socket
import threading
import time

import orjson
import pytest

from protoflask.auth import TokenAuthority

from ..hardening_support import ZERO_MASK, connect, ws_frame, ws_open
from ..support import SECRET, GunicornServer, WSClient, hello_payload, timeout

FLOOD_SECONDS = 30  # the flood stops by itself at the latest then


@pytest.fixture(scope="module", params=["default", "0"], ids=["rate-limited", "no-rate-limit"])
def flooded_server(request):
    server = GunicornServer(env={} if request.param == "default" else {"RATE_LIMIT": "0"})
    try:
        yield server
    finally:
        server.stop()


def envelope(seq: int, type_: str, payload: dict) -> bytes:
    return orjson.dumps({"id": f"f-{seq}", "session": "flood", "seq": str(seq),
                         "ts": str(int(time.time() * 1000)), "type": type_,
                         "channel": "SYSTEM", "payload": payload})


def ndjson_chunk(lines: list[bytes]) -> bytes:
    """Lines of NDJSON as one chunk of a chunked request body."""
    body = b"".join(line + b"\n" for line in lines)
    return b"%x\r\n%s\r\n" % (len(body), body)


def posts(path: str, token: str, lines: list[bytes]) -> bytes:
    """The lines as pipelined keep-alive POSTs of 50 each."""
    out = []
    for i in range(0, len(lines), 50):
        body = b"".join(line + b"\n" for line in lines[i:i + 50])
        out.append((f"POST {path} HTTP/1.1\r\nHost: flood\r\n"
                    f"Authorization: Bearer {token}\r\nContent-Type: application/x-ndjson\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return b"".join(out)


class Flood:
    """A raw client that writes PINGs, 1,000 at a time, until stopped: WebSocket frames,
    the lines of a duplex stream's chunked body, or pipelined follow-up POSTs to a stream
    session on a second connection (``posts``)."""

    def __init__(self, kind: str, base_url: str, token: str) -> None:
        hello = envelope(1, "HELLO", hello_payload())
        if kind == "websocket":
            self.sock = ws_open(base_url, token)
            self.sock.sendall(ws_frame(hello, mask=ZERO_MASK))
            self.encode = lambda lines: b"".join(ws_frame(line, mask=ZERO_MASK)
                                                 for line in lines)
        else:
            self.sock = connect(base_url)
            if kind == "posts":
                self.sock.sendall(posts("/proto/stream", token, [hello]))
            else:
                self.encode = ndjson_chunk
                self.sock.sendall((f"POST /proto/stream HTTP/1.1\r\nHost: flood\r\n"
                                   f"Authorization: Bearer {token}\r\n"
                                   "Content-Type: application/x-ndjson\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n").encode()
                                  + ndjson_chunk([hello]))
            head = b""
            while b"\r\n\r\n" not in head:
                head += self.sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
        self.sock.settimeout(timeout(10))
        self.out = self.sock  # where the PINGs go
        if kind == "posts":
            session = head.lower().split(b"proto-session:", 1)[1].split(b"\r\n", 1)[0]
            path = f"/proto/stream?session={session.strip().decode()}"
            self.encode = lambda lines: posts(path, token, lines)
            self.out = connect(base_url)
            self.out.settimeout(timeout(10))
        self.stop = threading.Event()
        self.running = threading.Event()  # set while PINGs are being written
        self.sent = 0
        self.received = 0
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._write, daemon=True)] + [
            threading.Thread(target=self._read, args=(sock,), daemon=True)
            for sock in {self.sock, self.out}]
        for t in self.threads:
            t.start()

    def _write(self) -> None:
        seq, deadline = 1, time.monotonic() + FLOOD_SECONDS
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                batch = self.encode([envelope(seq + i, "PING", {"nonce": f"n{seq + i}"})
                                     for i in range(1, 1001)])
                seq += 1000
                self.out.sendall(batch)
                self.sent += 1000
                self.running.set()
        except OSError as exc:
            self.error = exc
        finally:
            self.running.clear()

    def _read(self, sock: socket.socket) -> None:
        try:
            while True:
                data = sock.recv(262144)
                if not data:
                    return
                self.received += data.count(b'"type":"PONG"')
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.threads[0].join(timeout(10))
        for sock in {self.sock, self.out}:
            sock.close()
        for t in self.threads[1:]:
            t.join(timeout(10))


def assert_served_during(flood: Flood, base_url: str, token: str) -> None:
    """Once the flood is under way (20 writes of 1,000 PINGs went out, so the server is
    reading them), another client connects, shakes hands and gets its PONG before the
    flood ends."""
    try:
        deadline = time.monotonic() + timeout(10)
        while flood.sent < 20_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flood.sent >= 20_000 and flood.running.is_set(), \
            (flood.sent, flood.received, flood.error)
        with WSClient(base_url, token, compression=False) as other:
            other.hello()
            other.send("PING", "SYSTEM", {"nonce": "still-served"})
            other.recv_type("PONG", within=10, nonce="still-served")
            served_during_flood = flood.running.is_set()
        assert served_during_flood, "the other client was served only once the flood ended"
        assert flood.error is None, flood.error
    finally:
        flood.close()


@pytest.mark.parametrize("kind", ["websocket", "stream", "posts"])
def test_a_client_that_never_pauses_does_not_starve_the_others(flooded_server, kind):
    authority = TokenAuthority(SECRET)
    flood = Flood(kind, flooded_server.base_url, authority.issue("flooder"))
    assert_served_during(flood, flooded_server.base_url, authority.issue("other"))


def test_pipelined_posts_do_not_starve_the_embedded_server(make_server):
    """The same for protoflask's own gevent server (``ProtoServer.start()``)."""
    server = make_server(rateLimit=0)
    flood = Flood("posts", server.base_url, server.issue_token("flooder"))
    assert_served_during(flood, server.base_url, server.issue_token("other"))
