"""A live fuzz of every transport against real servers (embedded, and gunicorn, whose
own parser reads the raw HTTP): hostile protocol messages, random and truncated WebSocket
frames, malformed request lines, headers, Host and Content-Length, and slow partial
requests. Afterwards each server still answers /health and a PING, and holds no more
running greenlets, connections or sessions than before (counted in the server process
through /debug/vitals).

Inputs are drawn from a seeded generator (PROTOFLASK_FUZZ_SEED, PROTOFLASK_FUZZ_CASES)
so a failure can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time

import orjson
import pytest

from ..hardening_support import (
    live_with_baseline,
    HELLO, Live, answers, envelope, raw_exchange, rst_close, settled, status_of, vitals, ws_frame,
    ws_hello, ws_open,
)
from ..support import CLIENTS, SSEClient, timeout, wait_for

SEED = int(os.environ.get("PROTOFLASK_FUZZ_SEED", "7"))
CASES = int(os.environ.get("PROTOFLASK_FUZZ_CASES", "40"))
#: what the tests tried, for docs/RELIABILITY.md (printed with -s)
TRIED: dict[str, int] = {}


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    yield from live_with_baseline(request.param, rateLimit=0)


def after_fuzz(live: Live) -> None:
    """The server answers, and gives back every greenlet, connection and session."""
    answers(live.base_url, live.token())
    settled(live.base_url, live.baseline)  # type: ignore[attr-defined]


# -- hostile protocol messages on every transport ------------------------------------------


def hostile_frames(rng: random.Random, n: int) -> list[bytes]:
    valid = [orjson.dumps(envelope("PING", payload={"nonce": "x"}, seq=1000)),
             orjson.dumps(envelope("TOOL_CALL", "USER", {"call_id": "c", "tool": "add",
                                                         "params": {"a": 1, "b": 2}}, seq=1001)),
             orjson.dumps(HELLO)]
    fixed = [
        b"{" * 3000, b"[" * 1100 + b"]" * 1100, b'{"payload":' * 200 + b"1" + b"}" * 200,
        b'{"id":"a","seq":"1","n":1' + b"0" * 500 + b"}", b"1e999", b"-Infinity", b"NaN",
        b"\xef\xbb\xbf{}", b"null", b'"\\ud800"',
        orjson.dumps(envelope("PING", payload={"nonce": "n"}, seq="9" * 5000)),
        json.dumps(envelope("ACK", payload={"seq": 2**70}, seq=3)).encode(),
        orjson.dumps(envelope("FLOW_UPDATE", payload={"channel": "USER",
                                                      "add_messages": 2**62}, seq=4)),
        orjson.dumps(envelope("REPLAY_REQUEST", payload={"from_seq": 1, "to_seq": 2**63}, seq=5)),
        orjson.dumps(envelope("MESSAGE_PART", "USER", {"message_id": "nope", "content": "x"},
                              seq=6)),
        orjson.dumps(envelope("AUDIO_CHUNK", "AUDIO_IN", {"message_id": "a", "mime": "x",
                                                          "data": "!!!"}, seq=7)),
    ]
    out = list(fixed)
    while len(out) < n:
        base = bytearray(rng.choice(valid))
        how = rng.randrange(4)
        if how == 0:  # truncated
            out.append(bytes(base[:rng.randrange(1, len(base))]))
        elif how == 1:  # bytes flipped
            for _ in range(rng.randrange(1, 6)):
                base[rng.randrange(len(base))] = rng.randrange(32, 127)
            out.append(bytes(base))
        elif how == 2:  # random printable noise
            out.append(bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 200))))
        else:  # a field replaced by something of another type
            obj = orjson.loads(base)
            key = rng.choice(list(obj))
            obj[key] = rng.choice([None, 1, -1, 1.5, [], {}, "", "x" * 300, True, [[[[]]]]])
            out.append(orjson.dumps(obj))
    # every transport carries one message per line / frame / body
    return [f.replace(b"\n", b" ").replace(b"\r", b" ") for f in out]


@pytest.mark.parametrize("transport", sorted(CLIENTS))
def test_hostile_messages_on_each_transport(live, transport):
    rng = random.Random(f"{SEED}-{transport}-{live.kind}")
    frames = hostile_frames(rng, CASES)
    TRIED[f"messages/{transport}"] = TRIED.get(f"messages/{transport}", 0) + len(frames)
    client = CLIENTS[transport](live.base_url, live.token())
    try:
        client.hello()
        for frame in frames:
            client.send_raw(frame.decode("utf-8", "replace"))
        client.send("PING", "SYSTEM", {"nonce": "survived"}, seq=str(2**53 - 1))  # the largest seq
        client.recv_type("PONG", nonce="survived", within=15)
        errors = [m["payload"]["code"] for m in client.received if m["type"] == "ERROR"]
        assert errors and set(errors) <= {"INVALID_MESSAGE", "UNSUPPORTED_TYPE",
                                          "MISSING_RUN_ID", "RUN_NOT_FOUND", "MESSAGE_TOO_LARGE",
                                          "REPLAY_UNAVAILABLE", "TOOL_NOT_FOUND"}, errors
    finally:
        client.close()
    after_fuzz(live)


# -- WebSocket frames ------------------------------------------------------------------------


def frame_cases(rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    ping = orjson.dumps(envelope("PING", payload={"nonce": "f"}, seq=2))
    cases = [
        ("truncated header", b"\x81"),
        ("truncated length", b"\x81\xfe\x01"),
        ("truncated payload", ws_frame(ping)[:-5]),
        ("huge length claim", ws_frame(b"", length=2**62)[:10]),
        ("unmasked", ws_frame(ping, mask=b"")),
        ("reserved bits", ws_frame(ping, rsv=7)),
        ("unknown opcode", ws_frame(ping, opcode=3)),
        ("control frame too long", ws_frame(b"x" * 200, opcode=9)),
        ("fragmented control frame", ws_frame(b"p", opcode=9, fin=False)),
        ("continuation without start", ws_frame(ping, opcode=0)),
        ("text then text inside a fragment", ws_frame(b"{", fin=False) + ws_frame(b"}")),
        ("invalid utf-8", ws_frame(b'{"id": "\xc3\x28"}')),
        ("close with bad code", ws_frame(b"\x03\xe7", opcode=8)),
        ("close with one byte", ws_frame(b"\x03", opcode=8)),
        ("close with bad utf-8 reason", ws_frame(b"\x03\xe8\xff", opcode=8)),
        ("binary", ws_frame(os.urandom(64), opcode=2)),
        ("ping flood", b"".join(ws_frame(b"p", opcode=9) for _ in range(50))),
        ("deep json", ws_frame(b"[" * 5000)),
        ("message over maxMessageSize", ws_frame(b"x" * 1048577)[:70000]),
    ]
    while len(cases) < n:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        frame = ws_frame(data, opcode=rng.choice([0, 1, 2, 8, 9, 10, rng.randrange(16)]),
                         fin=rng.random() < 0.8, rsv=rng.choice([0, 0, 0, rng.randrange(8)]))
        if rng.random() < 0.3:
            frame = frame[:rng.randrange(1, len(frame) + 1)]
        cases.append((f"random {len(cases)}", frame))
    return cases


def test_websocket_frame_fuzz(live):
    rng = random.Random(f"{SEED}-frames-{live.kind}")
    cases = frame_cases(rng, CASES)
    TRIED["websocket frames"] = TRIED.get("websocket frames", 0) + len(cases)
    for i, (_name, data) in enumerate(cases):
        sock = ws_open(live.base_url, live.token())
        try:
            ws_hello(sock)
            sock.sendall(data)
            sock.settimeout(0.3)
            try:
                while sock.recv(65536):
                    pass
            except (TimeoutError, socket.timeout, ConnectionResetError):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed first: fine
        finally:
            rst_close(sock) if i % 2 else sock.close()
    after_fuzz(live)


# -- raw HTTP ----------------------------------------------------------------------------------


def http_cases(rng: random.Random, token: str, n: int) -> list[tuple[str, bytes]]:
    upgrade = ("Upgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    ws = f"GET /proto/websocket?token={token} HTTP/1.1\r\n"
    hello = orjson.dumps(HELLO)
    cases = [
        ("bogus host on upgrade", (ws + "Host: [::::bogus\r\n" + upgrade + "\r\n").encode()),
        ("no host on upgrade", (ws + upgrade + "\r\n").encode()),
        ("two hosts on upgrade", (ws + "Host: a\r\nHost: b\r\n" + upgrade + "\r\n").encode()),
        ("latin-1 host on upgrade", (ws + "Host: \xff\r\n" + upgrade + "\r\n").encode("latin-1")),
        ("upgrade without key", (ws + "Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                 "\r\n").encode()),
        ("upgrade with bad version", (ws + "Host: x\r\n" + upgrade.replace(
            "Version: 13", "Version: 99") + "\r\n").encode()),
        ("upgrade with broken extensions", (ws + "Host: x\r\n" + upgrade +
                                            "Sec-WebSocket-Extensions: permessage-deflate; "
                                            "server_max_window_bits=99;;\r\n\r\n").encode()),
        ("garbage request line", b"GARBAGE\r\n\r\n"),
        ("nul in method", b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("http/9.9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("long url", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("content-length abc", b"POST /proto/stream HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: abc\r\n\r\n"),
        ("content-length -5", b"POST /proto/sse?session=x HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: -5\r\n\r\n"),
        ("content-length 10^20", b"POST /proto/sse?session=x HTTP/1.1\r\nHost: x\r\n"
                                 b"Authorization: Bearer " + token.encode() +
                                 b"\r\nContent-Length: 99999999999999999999\r\n\r\nabc"),
        ("two content-lengths", b"POST /proto/stream HTTP/1.1\r\nHost: x\r\n"
                                b"Content-Length: 3\r\nContent-Length: 5\r\n\r\nabc"),
        ("content-length longer than the body", b"POST /proto/stream HTTP/1.1\r\nHost: x\r\n"
                                                b"Authorization: Bearer " + token.encode() +
                                                b"\r\nContent-Length: 500\r\n\r\n" + hello),
        ("broken chunked body", b"POST /proto/stream HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                b"Bearer " + token.encode() + b"\r\nTransfer-Encoding: chunked"
                                b"\r\n\r\nzz\r\nabc\r\n"),
        ("chunk size overflow", b"POST /proto/stream HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                b"Bearer " + token.encode() + b"\r\nTransfer-Encoding: chunked"
                                b"\r\n\r\nffffffffffffffffffff\r\nabc\r\n"),
        ("header without colon", b"GET /health HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n"),
        ("huge header", b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100000 + b"\r\n\r\n"),
        ("500 headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" +
         b"".join(b"X%d: y\r\n" % i for i in range(500)) + b"\r\n"),
        ("bad percent-encoding", b"GET /proto/sse?token=%zz%ff&session=%00 HTTP/1.1\r\n"
                                 b"Host: x\r\n\r\n"),
        ("latin-1 last-event-id", b"GET /proto/sse HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                  b"Bearer " + token.encode() + b"\r\nLast-Event-ID: "
                                  b"\xff:\xff\r\n\r\n"),
        ("5000-digit last_seq", b"GET /proto/sse?last_seq=" + b"9" * 3000 + b"&session=a&token=" +
         token.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("latin-1 bearer", b"GET /proto/sse HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                           b"\xff\xfe\r\n\r\n"),
        ("bare LF line ends", b"GET /health HTTP/1.1\nHost: x\n\n"),
        ("only CRLFs", b"\r\n" * 50),
        ("binary noise", bytes(rng.randrange(256) for _ in range(300))),
    ]
    valid = [
        f"GET /proto/sse?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"POST /proto/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {len(hello)}\r\n\r\n".encode() + hello,
        (ws + "Host: x\r\n" + upgrade + "\r\n").encode(),
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    while len(cases) < n:
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(1, len(data))]
        cases.append((f"mutated {len(cases)}", bytes(data)))
    return cases


def test_raw_http_fuzz(live):
    rng = random.Random(f"{SEED}-http-{live.kind}")
    cases = http_cases(rng, live.token(), CASES)
    TRIED["raw HTTP requests"] = TRIED.get("raw HTTP requests", 0) + len(cases)
    for name, data in cases:
        response = raw_exchange(live.base_url, data, wait=0.5)
        status = status_of(response)
        # an answer, a refusal or a closed connection: never a server error
        assert status is None or status < 500 or status == 503, (name, response[:300])
    after_fuzz(live)


def test_slow_partial_requests_do_not_starve_others(live):
    """Slowloris: many connections that send part of their headers and wait. Other
    clients are served meanwhile; once they go, nothing of them is left."""
    token = live.token()
    partial = [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        b"GET /proto/websocket?token=" + token.encode() + b" HTTP/1.1\r\nHost: x\r\nUpgrade: web",
        b"POST /proto/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() +
        b"\r\nContent-Length: 1000\r\n\r\n{\"id\":",
        b"POST /proto/sse?session=x HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{",
    ]
    socks = []
    TRIED["slow partial requests"] = TRIED.get("slow partial requests", 0) + 40
    try:
        for i in range(40):
            sock = socket.create_connection(("127.0.0.1", int(live.base_url.rsplit(":", 1)[1])),
                                            timeout=timeout(5))
            sock.sendall(partial[i % len(partial)])
            socks.append(sock)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the slow ones trickle a byte now and then
            for sock in socks[::5]:
                sock.sendall(b"a")
            answers(live.base_url, token)
    finally:
        for i, sock in enumerate(socks):
            rst_close(sock) if i % 2 else sock.close()
    after_fuzz(live)


def test_clients_that_vanish_at_every_step(live):
    """Connections dropped during the handshake, right after it, and mid-message."""
    token = live.token()
    steps = 0
    for transport, cls in sorted(CLIENTS.items()):
        for cut in ("before hello", "after hello", "mid message"):
            client = cls(live.base_url, token)
            if cut != "before hello":
                client.hello()
            if cut == "mid message":
                if isinstance(client, SSEClient):
                    pass  # an SSE POST cut mid-body is in test_faults
                elif transport == "stream":
                    client.send_chunk(b'{"id":"x","session":"","seq":"9","ts":"1","typ')
                else:
                    client.ws.socket.sendall(ws_frame(b'{"id":"x"', fin=True)[:8])
            client.drop()
            steps += 1
    TRIED["vanishing clients"] = TRIED.get("vanishing clients", 0) + steps
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="slots back")
    after_fuzz(live)


def test_report_what_was_tried(live):
    """Not a check: prints the counts for docs/RELIABILITY.md (run with -s)."""
    print(f"\n[{live.kind}] fuzz inputs so far: {TRIED}")
