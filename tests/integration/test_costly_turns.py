"""A flood of costly messages leaves everyone else their turn (issue 24, the tiny-call
attack).

A tool call whose params hold 100,000 ``{}`` (300 kB of JSON) costs the worker several
milliseconds (its parse, the depth check, the budget's charge) and deflates to a few
hundred bytes, so one read of a compressing WebSocket brings dozens of them. The reader
used to hand the others a "turn" with ``gevent.sleep(0)`` after each, which is none:
gevent runs the callbacks queued while it runs callbacks before it polls the sockets
again, so the reader went on with the next message and a bystander's PING, already
there, waited for the whole read. Now the reader gives a real turn
(``turns.give_turn``) once a read has taken ``turns.SLICE``, and a costly turn pauses
its user (``turns.Pacer``): the bystander's PONG comes while the flood is still being
handled. No timed assertions: whose PONG came first.
"""

from __future__ import annotations

import threading
import time
import zlib

import orjson
import pytest

from ..hardening_support import HELLO, Live, ZERO_MASK, connect, envelope, ws_frame
from ..support import WSClient, _host_port, timeout

CALLS = 40
PAD = 100_000  # {} per call


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, rateLimit=0, maxUserBytes=64 << 20)
    try:
        yield server
    finally:
        server.stop()


class Deflating:
    """A WebSocket upgraded by hand with permessage-deflate: frames built here, so that
    a whole flood goes out in one write (and comes to the server in one read)."""

    def __init__(self, base_url: str, token: str) -> None:
        self.sock = connect(base_url)
        host, port = _host_port(base_url)
        self.sock.sendall((
            f"GET /proto/websocket?token={token} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(4096)
        head, self.rest = head.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101") and b"permessage-deflate" in head, head
        self.deflate = zlib.compressobj(wbits=-15)
        self.inflate = zlib.decompressobj(wbits=-15)

    def frame(self, message: dict) -> bytes:
        data = self.deflate.compress(orjson.dumps(message)) \
            + self.deflate.flush(zlib.Z_SYNC_FLUSH)
        return ws_frame(data[:-4], rsv=4, mask=ZERO_MASK)  # RSV1: compressed

    def messages(self):
        """The server's messages, inflated, as they come."""
        buf = self.rest
        while True:
            while len(buf) < 2 or len(buf) < self._end(buf):
                piece = self.sock.recv(65536)
                if not piece:
                    return
                buf += piece
            end = self._end(buf)
            first, n = buf[0], buf[1] & 0x7F
            start = 2 if n < 126 else 4 if n == 126 else 10
            data = buf[start:end]
            buf = buf[end:]
            if first & 0x40:
                data = self.inflate.decompress(data + b"\x00\x00\xff\xff")
            if first & 0x0F == 1:
                yield orjson.loads(data)

    @staticmethod
    def _end(buf: bytes) -> int:
        n = buf[1] & 0x7F
        if n == 126:
            return 4 + int.from_bytes(buf[2:4], "big") if len(buf) >= 4 else 1 << 30
        if n == 127:
            return 10 + int.from_bytes(buf[2:10], "big") if len(buf) >= 10 else 1 << 30
        return 2 + n


def test_a_flood_of_costly_calls_leaves_a_bystander_its_turn(live):
    attacker = Deflating(live.base_url, live.token("flooder"))
    attacker.sock.settimeout(timeout(120))
    replies = attacker.messages()
    attacker.sock.sendall(attacker.frame(HELLO))
    assert next(m for m in replies if m["type"] == "HELLO")
    pad = [{}] * PAD
    flood = b"".join(attacker.frame(envelope("TOOL_CALL", "AGENT", {
        "call_id": f"c{i}", "tool": "sleep", "params": {"seconds": 20, "pad": pad}},
        seq=10 + i)) for i in range(CALLS))
    flood += attacker.frame(envelope("PING", payload={"nonce": "flooder"}, seq=99))
    assert len(flood) < 32_768  # one read of the server's (64 KiB)
    came: dict[str, float] = {}

    def read_attacker() -> None:
        for message in replies:
            if message["type"] == "PONG":
                came["flooder"] = time.monotonic()
                return

    with WSClient(live.base_url, live.token("bystander"), compression=False) as bystander:
        bystander.hello()
        reader = threading.Thread(target=read_attacker, daemon=True)
        reader.start()
        attacker.sock.sendall(flood)
        time.sleep(0.05)  # the flood is in the server's socket buffer, being read
        bystander.send("PING", "SYSTEM", {"nonce": "bystander"})
        bystander.recv_type("PONG", within=120, nonce="bystander")
        came["bystander"] = time.monotonic()
        reader.join(timeout(120))
    attacker.sock.close()
    assert "flooder" in came, "the flood's own PING was never answered"
    assert came["bystander"] < came["flooder"], \
        "the bystander's PING waited for the whole flood"
