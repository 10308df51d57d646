"""Reconnect storms (issue 29): N handshakes at once, `inflight` at a time, each held open.

    python bench/storm.py '<json config>'

Config: {baseUrl: "http://127.0.0.1:PORT", mode, proto: "proto"|"echo", connections,
inflight (100), secret (the server's JWT secret: one token per user, signed here before
the clock starts), serverPid?, clkTck?, replay (10, resume modes), dropPause (s between
the drop seen and the resume storm, for a probe: 0)}. Modes:

- ``ws``: the WebSocket upgrade, then (proto) HELLO and its reply; echo: the 101 alone.
- ``sse``: ``GET /proto/sse?token=`` until its ``event: session``.
- ``stream``: ``POST /proto/stream`` with the HELLO as its body, until the HELLO reply line.
- ``resume``: untimed, N WebSocket sessions handshake and PING ``replay`` times (their
  PONGs are what is replayed), then all drop at once and, once the server's /stats says
  no transport is left, the timed storm resumes them (``?session=&last_seq=<the HELLO
  reply's seq>``); a resume is done when its ``replay`` messages arrived. After the
  storm every session's seqs must be exactly last_seq+1 .. last_seq+replay, once each.

Every connection answers the server's heartbeat PINGs while it is held. One user per
connection (``sub`` u<i>), as in a real storm. Prints one JSON line when the storm is
done ({"event": "ready", connect_per_s, server and generator CPU}), holds every
connection until a line arrives on stdin, then prints a last line (how many were still
open, heartbeats answered, and for resumes the exactly-once check).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402
from gevent.fileobject import FileObject  # noqa: E402
from gevent.lock import BoundedSemaphore  # noqa: E402
from _proc import server_cpu  # noqa: E402

HELLO = ('{"proto_version":"1.1.2","accept_major":[1],"accept_events":[],'
         '"capabilities":{"flow_control":{"initial_credit_messages":1000000000,'
         '"initial_credit_bytes":1000000000000}}}')
SEQ = re.compile(rb'"seq":"(\d+)"')
KEY = base64.b64encode(b"0123456789abcdef").decode()


def envelope(idx: int, seq: int, type: str, payload: str) -> bytes:
    return (f'{{"id":"c{idx}-{seq}","session":"","seq":"{seq}","ts":"0","type":"{type}",'
            f'"channel":"SYSTEM","payload":{payload}}}').encode()


def frame(payload: bytes) -> bytes:
    """A masked client text frame (the zero mask: the payload goes as it is)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    return head + b"\0\0\0\0" + payload


class Conn:
    """One client connection: its socket, what it has read, what it must answer."""

    def __init__(self, cfg: dict, idx: int, token: str) -> None:
        self.cfg, self.idx, self.token = cfg, idx, token
        self.sock: socket.socket | None = None
        self.buf = b""
        self.seq = 0
        self.session = ""
        self.last_seq = 0
        self.until = 0  # prepared: the seq of the last message a resume must replay
        self.seqs: list[int] = []  # resumed: the seqs that came after last_seq
        self.heartbeats = 0
        self.open = False
        self.began = self.connected = self.ended = 0.0  # the timed step's clock (perf_counter)

    # -- the socket -----------------------------------------------------------------------
    def connect(self) -> None:
        self.began = time.perf_counter()
        self.sock = socket.create_connection(self.cfg["addr"])
        self.connected = time.perf_counter()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def recv(self) -> bytes:
        assert self.sock is not None
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        return data

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers

    def send(self, type: str, payload: str) -> None:
        assert self.sock is not None
        self.seq += 1
        self.sock.sendall(frame(envelope(self.idx, self.seq, type, payload)))

    def frames(self):
        """The server's frames (text payloads), answering heartbeat PINGs on the way."""
        while True:
            while len(self.buf) >= 2:
                b1 = self.buf[1] & 0x7F
                at = 2
                if b1 == 126:
                    if len(self.buf) < 4:
                        break
                    b1, at = struct.unpack("!H", self.buf[2:4])[0], 4
                elif b1 == 127:
                    if len(self.buf) < 10:
                        break
                    b1, at = struct.unpack("!Q", self.buf[2:10])[0], 10
                if len(self.buf) < at + b1:
                    break
                op, payload = self.buf[0] & 0x0F, self.buf[at:at + b1]
                self.buf = self.buf[at + b1:]
                if op == 8:
                    raise ConnectionError(f"close frame {payload[:2].hex()}")
                if op == 1:
                    if b'"type":"PING"' in payload:
                        nonce = json.loads(payload)["payload"]["nonce"]
                        self.send("PONG", json.dumps({"nonce": nonce}))
                        self.heartbeats += 1
                    yield payload
            self.buf += self.recv()

    # -- the handshakes ----------------------------------------------------------------------
    def upgrade(self, query: str) -> None:
        assert self.sock is not None
        host = self.cfg["host"]
        self.sock.sendall((f"GET /proto/websocket{query} HTTP/1.1\r\nHost: {host}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        status, _ = self.head()
        if status != 101:
            raise ConnectionError(f"upgrade answered {status}: {self.buf[:200]!r}")

    def ws(self) -> None:
        self.connect()
        if self.cfg["proto"] == "echo":
            self.upgrade("")
            return
        self.upgrade(f"?token={self.token}")
        self.send("HELLO", HELLO)
        for payload in self.frames():
            if b'"type":"HELLO"' in payload:
                reply = json.loads(payload)
                self.session = reply["payload"]["session"]
                self.last_seq = int(reply["seq"])
                return

    def sse(self) -> None:
        self.connect()
        assert self.sock is not None
        self.sock.sendall((f"GET /proto/sse?token={self.token} HTTP/1.1\r\n"
                           f"Host: {self.cfg['host']}\r\nAccept: text/event-stream\r\n\r\n")
                          .encode())
        status, _ = self.head()
        if status != 200:
            raise ConnectionError(f"SSE answered {status}: {self.buf[:200]!r}")
        while b"event: session" not in self.buf:
            self.buf += self.recv()

    def stream(self) -> None:
        self.connect()
        assert self.sock is not None
        body = envelope(self.idx, 1, "HELLO", HELLO) + b"\n"
        self.sock.sendall((f"POST /proto/stream HTTP/1.1\r\nHost: {self.cfg['host']}\r\n"
                           f"Authorization: Bearer {self.token}\r\n"
                           "Content-Type: application/x-ndjson\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        status, _ = self.head()
        if status != 200:
            raise ConnectionError(f"stream answered {status}: {self.buf[:200]!r}")
        while not (b'"type":"HELLO"' in self.buf and self.buf.endswith(b"\n")):
            self.buf += self.recv()

    def prepare(self) -> None:
        """A session with ``replay`` PONGs after its HELLO reply (what a resume replays)."""
        self.ws()
        n = self.cfg["replay"]
        for i in range(n):
            self.send("PING", f'{{"nonce":"p{i}"}}')
        got = 0
        for payload in self.frames():
            if b'"type":"PONG"' in payload:
                got += 1
                if got == n:
                    self.until = int(json.loads(payload)["seq"])
                    return

    def resume(self) -> None:
        self.connect()
        self.seq = 0
        self.upgrade(f"?token={self.token}&session={self.session}&last_seq={self.last_seq}")
        for payload in self.frames():
            m = SEQ.search(payload)
            if m:
                self.seqs.append(int(m.group(1)))
                if self.seqs[-1] >= self.until:
                    return

    def replayed_exactly_once(self) -> bool:
        want = list(range(self.last_seq + 1, self.until + 1))
        return sorted(s for s in self.seqs if s <= self.until) == want \
            and len(self.seqs) == len(set(self.seqs))

    def hold(self) -> None:
        """Read (and answer heartbeats) until the connection ends."""
        try:
            if self.cfg["mode"] in ("ws", "resume") and self.cfg["proto"] == "proto":
                for payload in self.frames():
                    m = SEQ.search(payload)
                    if m and self.cfg["mode"] == "resume":
                        self.seqs.append(int(m.group(1)))
            else:
                while True:
                    self.recv()
        except (OSError, ConnectionError):
            pass
        self.open = False

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass


def active_connections(base: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{base}/stats", timeout=10) as r:
            return int(json.loads(r.read())["activeConnections"])
    except (OSError, ValueError, KeyError):
        return None


def storm(conns: list[Conn], step: str, inflight: int, state: dict) -> list[gevent.Greenlet]:
    """Every connection's ``step``, ``inflight`` at a time; each then held open."""
    gate = BoundedSemaphore(inflight)

    def one(c: Conn) -> None:
        with gate:
            try:
                getattr(c, step)()
            except (OSError, ConnectionError, ValueError, KeyError) as exc:
                state["failed"] += 1
                state["error"] = state["error"] or f"{step}: {exc!r}"
                c.close()
                return
            c.open = True
            state["done"] += 1
            state["last"] = c.ended = time.perf_counter()
        c.hold()

    return [gevent.spawn(one, c) for c in conns]


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of ``values`` (seconds) in ms."""
    if not values:
        return {}
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"p50": round(at(0.5) * 1e3, 1), "p90": round(at(0.9) * 1e3, 1),
            "p99": round(at(0.99) * 1e3, 1), "max": round(v[-1] * 1e3, 1)}


def timeline(conns: list[Conn], t0: float) -> dict[str, object]:
    """Where a storm's time went, from the client (a stall shows as one slow step):
    each handshake's duration (connect() to done) and its connect() alone, and when
    the first 50/90/99/100% were done (s from the start)."""
    done = [c for c in conns if c.ended]
    ends = sorted(c.ended - t0 for c in done)
    at = {f"done_{int(q * 100)}pct_s": round(ends[min(len(ends) - 1, int(q * len(ends)))], 3)
          for q in (0.5, 0.9, 0.99)} if ends else {}
    return {"started_at": round(time.time() - (time.perf_counter() - t0), 3),
            "step_ms": quantiles([c.ended - c.began for c in done]),
            "connect_ms": quantiles([c.connected - c.began for c in done]), **at}


def time_wait() -> int | None:
    """Sockets in TIME_WAIT on the machine (IPv4): the rows before leave up to N each for
    60 s, and connect() looks for a free port among them."""
    try:
        with open("/proc/net/tcp", "rb") as f:
            return sum(1 for line in f if line.split()[3:4] == [b"06"])
    except OSError:
        return None


def wait_for(state: dict, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while state["done"] + state["failed"] < n and time.monotonic() < deadline:
        gevent.sleep(0.01)


def main() -> None:
    cfg = {"mode": "ws", "proto": "proto", "connections": 100, "inflight": 100,
           "serverPid": 0, "clkTck": os.sysconf("SC_CLK_TCK"), "replay": 10,
           "timeout": 300, **json.loads(sys.argv[1])}
    u = urlsplit(cfg["baseUrl"])
    cfg["addr"], cfg["host"] = (u.hostname, u.port), f"{u.hostname}:{u.port}"
    n, mode = cfg["connections"], cfg["mode"]
    tokens = [""] * n
    if cfg["proto"] == "proto":
        import jwt

        exp = int(time.time()) + 3600
        tokens = [jwt.encode({"sub": f"u{i}", "exp": exp}, cfg["secret"], algorithm="HS256")
                  for i in range(n)]
    conns = [Conn(cfg, i, tokens[i]) for i in range(n)]
    base = {"mode": mode, "proto": cfg["proto"], "connections": n,
            "inflight": cfg["inflight"], "generator": "python-gevent"}
    prepared: dict = {}
    if mode == "resume":
        pstate = {"done": 0, "failed": 0, "error": None, "last": 0.0}
        held = storm(conns, "prepare", cfg["inflight"], pstate)
        wait_for(pstate, n, cfg["timeout"])
        t0 = time.perf_counter()
        for c in conns:
            c.close()  # the drop: every socket at once
        gevent.killall(held, block=True, timeout=5)
        # /stats not answering (busy with the drop: a timeout, an error) is not "no
        # transport left": the storm would start while the drop is still being handled
        unanswered = 0
        while time.perf_counter() - t0 < 60:
            left = active_connections(cfg["baseUrl"])
            if left == 0:
                break
            unanswered += left is None
            gevent.sleep(0.1)
        prepared = {"prepared": pstate["done"], "prepare_error": pstate["error"],
                    "drop_seen_s": round(time.perf_counter() - t0, 3),
                    "drop_stats_unanswered": unanswered}
        conns = [c for c in conns if c.session]
        for c in conns:
            c.seqs = []
        if cfg.get("dropPause"):  # a probe may act on the worker between drop and storm
            print(json.dumps({"event": "dropped"}), file=sys.stderr, flush=True)
            gevent.sleep(cfg["dropPause"])
    step = {"ws": "ws", "sse": "sse", "stream": "stream", "resume": "resume"}[mode]
    state = {"done": 0, "failed": 0, "error": None, "last": 0.0}
    waiting = time_wait()
    print(json.dumps({"event": "storm"}), file=sys.stderr, flush=True)  # (for a profiler)
    srv0 = server_cpu(cfg["serverPid"], cfg["clkTck"])
    cpu0, t0 = time.process_time(), time.perf_counter()
    held = storm(conns, step, cfg["inflight"], state)
    wait_for(state, len(conns), cfg["timeout"])
    seconds = (state["last"] or time.perf_counter()) - t0
    gen_cpu = time.process_time() - cpu0
    srv1 = server_cpu(cfg["serverPid"], cfg["clkTck"])
    srv = None if srv0 is None or srv1 is None else srv1 - srv0
    done = state["done"]
    print(json.dumps({
        **base, **prepared, "event": "ready", "connected": done, "failed": state["failed"],
        "first_error": state["error"], "seconds": round(seconds, 3),
        "connect_per_s": round(done / seconds, 1) if seconds > 0 else None,
        "server_cpu_s": None if srv is None else round(srv, 3),
        "server_us_per_connect": None if srv is None or not done
        else round(srv * 1e6 / done, 1),
        "gen_cpu_pct": round(100 * gen_cpu / seconds, 1) if seconds > 0 else None,
        "timeline": {**timeline(conns, t0), "time_wait_before": waiting},
    }), flush=True)
    FileObject(sys.stdin.fileno(), "r", close=False).readline()  # held (a greenlet waits)
    final: dict = {"still_open": sum(1 for c in conns if c.open),
                   "heartbeats_answered": sum(c.heartbeats for c in conns)}
    if mode == "resume":
        final.update({
            "resumed": len(conns),
            "replayed_exactly_once": sum(1 for c in conns if c.replayed_exactly_once()),
            "replay_duplicates": sum(len(c.seqs) - len(set(c.seqs)) for c in conns),
            "replay_missing": sum(len(set(range(c.last_seq + 1, c.until + 1)) - set(c.seqs))
                                  for c in conns)})
    for c in conns:
        c.close()
    gevent.killall(held, block=True, timeout=5)
    print(json.dumps({**base, "event": "closed", **final}), flush=True)


if __name__ == "__main__":
    main()
