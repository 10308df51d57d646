"""A session's memory budget and the cost of its errors, attacked on a live server (the
embedded one and gunicorn, whose worker's RSS /debug/vitals reports):

* REPLAY_REQUESTs for a full window from a client that never reads (WebSocket and the
  HTTP stream) cost no more than the window, and a slow consumer whose buffer fills with
  replays is closed with its session kept;
* 1 MB texts posted into a disconnected session stay within replayWindowBytes;
* open texts, their size, and echoes split within maxMessageSize;
* a HELLO with 250k bad elements answers a small ERROR; errors count against the rate
  limit; seqs above 2^53-1 are INVALID_MESSAGE.
No timed assertions: sizes and counts (and deadlines for what must happen).
"""

from __future__ import annotations

import socket
import struct

import orjson
import pytest
import requests

from ..hardening_support import (
    HELLO, Live, answers, envelope, vitals, ws_frame, ws_open,
)
from ..support import WSClient, chunk, open_http, timeout, wait_for

MIB = 1 << 20
TEXTS = 333  # echoed as START, PART, END: a full default window (1000 messages)
TEXT_SIZE = 2000


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, replayWindowTime=60000)
    try:
        yield server
    finally:
        server.stop()


def text_envelopes(first_seq: int, count: int = TEXTS, size: int = TEXT_SIZE) -> list[dict]:
    out = []
    seq = first_seq
    for i in range(count):
        mid = f"t{i}"
        for type, payload in (("MESSAGE_START", {"message_id": mid, "content_type": "text/plain"}),
                              ("MESSAGE_PART", {"message_id": mid, "content": "x" * size}),
                              ("MESSAGE_END", {"message_id": mid})):
            out.append(envelope(type, "USER", payload, seq=seq))
            seq += 1
    return out


def replay_requests(first_seq: int, count: int = 400) -> list[dict]:
    return [envelope("REPLAY_REQUEST", payload={"from_seq": "1"}, seq=first_seq + i)
            for i in range(count)]


class FrameReader:
    """Server frames (unmasked, uncompressed) from a raw WebSocket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _need(self, n: int) -> None:
        while len(self.buf) < n:
            piece = self.sock.recv(1 << 20)
            if not piece:
                raise EOFError
            self.buf += piece

    def message(self) -> tuple[int, bytes]:
        self._need(2)
        opcode, n = self.buf[0] & 0x0F, self.buf[1] & 0x7F
        head = 2
        if n == 126:
            self._need(4)
            n, head = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10)
            n, head = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(head + n)
        data, self.buf = self.buf[head:head + n], self.buf[head + n:]
        return opcode, data


def rss(live) -> int:
    return vitals(live.base_url)["rss"]


def wait_processed(live, before: int, count: int) -> None:
    wait_for(lambda: vitals(live.base_url)["totalMessages"] >= before + count, within=30,
             what=f"the server to read {count} messages")


# -- REPLAY_REQUEST amplification ----------------------------------------------------------------


def test_replay_requests_from_a_websocket_that_never_reads_cost_at_most_the_window(live):
    token = live.token("replayer-ws")
    sock = ws_open(live.base_url, token)
    try:
        reader = FrameReader(sock)
        sock.sendall(ws_frame(orjson.dumps(HELLO)) + b"".join(
            ws_frame(orjson.dumps(e)) for e in text_envelopes(2)))
        ends = 0
        while ends < TEXTS:  # read every echo: the window is full, nothing is pending
            _, data = reader.message()
            ends += orjson.loads(data)["type"] == "MESSAGE_END"
        before = vitals(live.base_url)
        sock.sendall(b"".join(ws_frame(orjson.dumps(e))
                              for e in replay_requests(2 + 3 * TEXTS)))  # ~50 kB
        wait_processed(live, before["totalMessages"], 400)
        grown = rss(live) - before["rss"]
        # the window is ~2.3 MB; 400 copies of it (old main) were ~900 MB
        assert grown < 64 * MIB, f"worker grew {grown / MIB:.0f} MiB"
        answers(live.base_url, live.token("bystander"))
    finally:
        sock.close()


def test_replay_requests_on_an_http_stream_that_never_reads_cost_at_most_the_window(live):
    token = live.token("replayer-stream")
    sock = open_http(live.base_url, "POST", "/proto/stream",
                     {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"})
    try:
        sock.sendall(chunk(orjson.dumps(HELLO) + b"\n"))
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        head = got.partition(b"\r\n\r\n")[0].decode("latin-1")
        session = [line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("proto-session:")][0]
        sock.sendall(b"".join(chunk(orjson.dumps(e) + b"\n") for e in text_envelopes(2)))
        sock.settimeout(timeout(10))
        while got.count(b'"MESSAGE_END"') < TEXTS:
            got += sock.recv(1 << 20)
        before = vitals(live.base_url)
        body = b"".join(orjson.dumps(e) + b"\n" for e in replay_requests(2 + 3 * TEXTS))
        resp = requests.post(f"{live.base_url}/proto/stream?session={session}", data=body,
                             headers={"Authorization": f"Bearer {token}"}, timeout=timeout(30))
        assert resp.status_code == 202 and resp.json() == {"accepted": 400}
        grown = rss(live) - before["rss"]
        assert grown < 64 * MIB, f"worker grew {grown / MIB:.0f} MiB"
        answers(live.base_url, live.token("bystander"))
    finally:
        sock.close()


def test_a_stream_whose_buffer_fills_with_replays_is_closed_and_its_session_kept(make_server):
    server = make_server(outboundBufferSize=65536, heartbeatInterval=600000)
    token = server.issue_token("slow")
    sock = open_http(server.base_url, "POST", "/proto/stream",
                     {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"},
                     rcvbuf=4096)
    try:
        sock.sendall(chunk(orjson.dumps(HELLO) + b"\n"))
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        head = got.partition(b"\r\n\r\n")[0].decode("latin-1")
        session = [line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("proto-session:")][0]
        texts = text_envelopes(2, count=20, size=2000)
        sock.settimeout(timeout(10))
        for i in range(20):  # one text at a time, each echo read: no back-pressure yet
            sock.sendall(b"".join(chunk(orjson.dumps(e) + b"\n") for e in texts[3 * i:3 * i + 3]))
            while got.count(b'"MESSAGE_END"') < i + 1:
                got += sock.recv(1 << 20)
        # now never read again, and keep asking for the whole window
        url = f"{server.base_url}/proto/stream?session={session}"
        auth = {"Authorization": f"Bearer {token}"}
        seq = 62
        ended = False
        for _ in range(300):
            requests.post(url, data=orjson.dumps(envelope(
                "REPLAY_REQUEST", payload={"from_seq": "1"}, seq=seq)), headers=auth,
                timeout=timeout(10))
            seq += 1
            if server.get_session(session)["connected"] is False:
                ended = True
                break
        if not ended:
            wait_for(lambda: server.get_session(session)["connected"] is False, within=10,
                     what="the slow consumer's stream to be closed")
        assert server.get_session(session) is not None  # kept for resume
        with WSClient(server.base_url, token, session=session, last_seq=61) as client:
            client.send("PING", "SYSTEM", {"nonce": "back"}, seq=str(seq))
            client.recv_type("PONG", nonce="back", within=10)
    finally:
        sock.close()


# -- the replay window by bytes ------------------------------------------------------------------


def test_big_texts_posted_to_a_disconnected_session_stay_within_replay_window_bytes(live):
    token = live.token("filler")
    with WSClient(live.base_url, token, compression=False) as client:
        client.hello()
        session = client.session_id
    before = rss(live)
    auth = {"Authorization": f"Bearer {token}"}
    content = "y" * 1_000_000
    seq = 2
    with requests.Session() as http:
        for i in range(60):  # 60 MB of echoes; replayWindowBytes is 4 MiB
            for type, payload in (
                    ("MESSAGE_START", {"message_id": f"b{i}", "content_type": "text/plain"}),
                    ("MESSAGE_PART", {"message_id": f"b{i}", "content": content}),
                    ("MESSAGE_END", {"message_id": f"b{i}"})):
                resp = http.post(f"{live.base_url}/proto/sse?session={session}", headers=auth,
                                 data=orjson.dumps(envelope(type, "USER", payload, seq=seq)),
                                 timeout=timeout(30))
                assert resp.status_code == 202
                seq += 1
    grown = rss(live) - before
    assert grown < 40 * MIB, f"worker grew {grown / MIB:.0f} MiB"
    # a resume gets what the window still holds, then REPLAY_UNAVAILABLE
    with WSClient(live.base_url, token, compression=False, session=session,
                  last_seq=1) as client:
        replayed = 0
        while True:
            msg = client.recv(within=10)
            if msg["type"] == "ERROR":
                assert msg["payload"]["code"] == "REPLAY_UNAVAILABLE"
                break
            replayed += len(orjson.dumps(msg))
        assert replayed <= 4 * MIB + MIB


# -- texts -----------------------------------------------------------------------------------------


def test_open_texts_and_text_size_are_bounded(make_server):
    server = make_server(maxOpenTexts=3, maxTextSize=100_000)
    with WSClient(server.base_url, server.issue_token("texter")) as client:
        client.hello()
        for i in range(4):
            client.send("MESSAGE_START", "USER", {"message_id": f"o{i}",
                                                  "content_type": "text/plain"})
        err = client.expect_error("INVALID_MESSAGE")
        assert "maxOpenTexts 3" in err["payload"]["message"]
        client.send("MESSAGE_PART", "USER", {"message_id": "o0", "content": "é" * 50_001})
        err = client.expect_error("MESSAGE_TOO_LARGE")
        assert "maxTextSize" in err["payload"]["message"]
        client.send("MESSAGE_END", "USER", {"message_id": "o0"})
        assert "o0" in client.expect_error("INVALID_MESSAGE")["payload"]["message"]


def test_an_echo_never_exceeds_max_message_size(make_server):
    server = make_server(maxMessageSize=65536)
    with WSClient(server.base_url, server.issue_token("echoer"), compression=False) as client:
        client.hello()
        text = "abcdé中😀" * 30_000  # 210k characters, 450 kB of UTF-8
        client.send("MESSAGE_START", "USER", {"message_id": "e", "content_type": "text/plain"})
        for i in range(0, len(text), 20_000):
            client.send("MESSAGE_PART", "USER", {"message_id": "e", "content": text[i:i + 20_000]})
        client.send("MESSAGE_END", "USER", {"message_id": "e"})
        parts, sizes = [], []
        while True:
            data = client.ws.recv(timeout=timeout(10))
            sizes.append(len(data.encode() if isinstance(data, str) else data))
            msg = orjson.loads(data)
            if msg["channel"] == "AGENT" and msg["type"] == "MESSAGE_PART":
                parts.append(msg["payload"]["content"])
            if msg["channel"] == "AGENT" and msg["type"] == "MESSAGE_END":
                break
        assert max(sizes) <= 65536 and len(parts) > 1
        assert "".join(parts) == text


# -- bounded error work ----------------------------------------------------------------------------


def test_a_hello_with_250k_bad_elements_answers_a_small_error_and_a_ping(live):
    sock = ws_open(live.base_url, live.token("validator"))
    try:
        reader = FrameReader(sock)
        hello = envelope("HELLO", payload={"proto_version": "1.1.2",
                                           "accept_major": [""] * 250_000})
        frame = orjson.dumps(hello)
        assert len(frame) > 700_000
        sock.sendall(ws_frame(frame) + ws_frame(orjson.dumps(
            envelope("PING", payload={"nonce": "after"}, seq=2))))
        _, data = reader.message()
        error = orjson.loads(data)
        assert error["payload"]["code"] == "INVALID_MESSAGE"
        assert len(data) < 4096, len(data)  # was 8.4 MB: one error per element
        assert len(error["payload"]["detail"]["accept_major"]) == 6  # five, and "more"
        _, data = reader.message()
        assert orjson.loads(data)["payload"] == {"nonce": "after"}
    finally:
        sock.close()


def test_error_replies_count_against_the_rate_limit(make_server):
    server = make_server(rateLimit=1, rateLimitBurst=10)
    with WSClient(server.base_url, server.issue_token("erring")) as client:
        client.hello()
        for _ in range(8):  # 8 messages, 8 ERRORs: 16 tokens of a burst of 10
            client.send("NO_SUCH_TYPE", "SYSTEM", {})
        client.expect_error("RATE_LIMITED")


def test_seqs_above_2_pow_53_minus_1_are_invalid(live):
    with WSClient(live.base_url, live.token("counter")) as client:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": "too-big"}, seq="9007199254740992")
        err = client.expect_error("INVALID_MESSAGE")
        assert "9007199254740991" in orjson.dumps(err["payload"]).decode()
        client.send("REPLAY_REQUEST", "SYSTEM", {"from_seq": "1" * 64}, seq="3")
        client.expect_error("INVALID_MESSAGE")
        client.send("PING", "SYSTEM", {"nonce": "max"}, seq="9007199254740991")
        client.recv_type("PONG", nonce="max")
        session = client.session_id
    token = live.token("counter")
    resp = requests.post(f"{live.base_url}/proto/stream?session={session}"
                         "&last_seq=9007199254740992", data=b"", timeout=timeout(10),
                         headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 400
