"""Downstream throughput of protoflask's HTTP transports (SSE and the NDJSON HTTP stream).

    python bench/http_downstream.py '<json config>'

Config: {baseUrl: "http://127.0.0.1:PORT", token,
transport: "sse"|"stream"|"duplex"|"floor", connections, warmup, seconds, batch,
serverPid?, clkTck?}. Per session: the downstream is opened
(``GET /proto/sse?token=`` or ``POST /proto/stream`` with the HELLO as its body), then a
keep-alive upstream connection POSTs batches of ``batch`` PINGs as NDJSON to
``?session=<id>``; the next batch goes once every PONG of the previous one came down the
stream. Messages/s is PONGs received per second in the measured window.

Transport ``duplex`` is the HTTP stream used full duplex: each batch goes up as one
chunk of the opening ``POST /proto/stream``'s own chunked body instead of a POST of its
own, so no request per batch (what a client that can stream a request body does).

Transport ``floor`` sends the same POSTs (to ``/proto/sse?session=``) with no downstream
and counts a batch as done when its answer is read: against
bench/servers/gunicorn_post_floor.py it measures what gunicorn's request handling alone
costs per POST. Messages/s is then the batch's messages per answered POST.

The client never parses the stream message by message: it counts ``"type":"PONG"`` in
what it reads (the server writes compact JSON), so its cost per message is a fraction of
the server's and it is not what limits the number. Prints one JSON result line like
bench/loadgen.c.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from _proc import measure, percentile_ms  # noqa: E402

SESSION = "0123456789abcdef0123456789abcdef"
PONG = b'"type":"PONG"'
HELLO_REPLY = b'"type":"HELLO"'
HELLO = ('{"proto_version":"1.1.2","accept_major":[1],"accept_events":[],'
         '"capabilities":{"flow_control":{"initial_credit_messages":1000000000,'
         '"initial_credit_bytes":1000000000000}}}')


def ndjson(envelopes: list[str]) -> bytes:
    return ("\n".join(envelopes) + "\n").encode()


def read_head(sock: socket.socket, buf: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed before the response head")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


class Session:
    def __init__(self, idx: int, cfg: dict) -> None:
        self.idx = idx
        self.cfg = cfg
        u = urlsplit(cfg["baseUrl"])
        self.addr = (u.hostname, u.port)
        self.host = f"{u.hostname}:{u.port}"
        self.token = cfg["token"]
        self.seq = 0
        self.pongs = 0
        self.hellos = 0
        self.target = 0
        self.arrived = Event()
        self.floor = cfg["transport"] == "floor"
        self.duplex = cfg["transport"] == "duplex"
        self.down = None if self.floor else self._connect()
        self.up = self.down if self.duplex else self._connect()
        self.up_buf = b""
        self.session_id = ""
        self.reader: gevent.Greenlet | None = None
        self.error: str | None = None

    def _connect(self) -> socket.socket:
        s = socket.create_connection(self.addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def envelope(self, type: str, channel: str, payload: str) -> str:
        self.seq += 1
        return (f'{{"id":"c{self.idx}-{self.seq}","session":"{SESSION}","seq":"{self.seq}",'
                f'"ts":"{int(time.time() * 1000)}","type":"{type}","channel":"{channel}",'
                f'"payload":{payload}}}')

    def open(self) -> None:
        transport = self.cfg["transport"]
        if self.down is None:  # the floor: POSTs only
            self.session_id = SESSION
            return
        if transport == "sse":
            req = (f"GET /proto/sse?token={self.token} HTTP/1.1\r\nHost: {self.host}\r\n"
                   "Accept: text/event-stream\r\n\r\n").encode()
        else:  # the stream: the HELLO is its body, or the first chunk of it (duplex)
            hello = [self.envelope("HELLO", "SYSTEM", HELLO)]
            body = self.chunk(hello) if self.duplex else ndjson(hello)
            framing = ("Transfer-Encoding: chunked" if self.duplex
                       else f"Content-Length: {len(body)}")
            req = (f"POST /proto/stream HTTP/1.1\r\nHost: {self.host}\r\n"
                   f"Authorization: Bearer {self.token}\r\n"
                   f"Content-Type: application/x-ndjson\r\n{framing}\r\n\r\n").encode() + body
        self.down.sendall(req)
        status, headers, rest = read_head(self.down)
        if status != 200:
            raise ConnectionError(f"{transport} downstream answered {status}: {rest[:200]!r}")
        self.session_id = headers.get("proto-session", "")
        if not self.session_id:
            raise ConnectionError("no Proto-Session header on the downstream")
        self.reader = gevent.spawn(self._read_down, rest)
        if transport == "sse":
            self.post([self.envelope("HELLO", "SYSTEM", HELLO)])
        deadline = time.monotonic() + 10
        while not self.hellos:
            if time.monotonic() > deadline or self.error:
                raise ConnectionError(self.error or "no HELLO reply on the downstream")
            gevent.sleep(0.005)

    def _read_down(self, data: bytes) -> None:
        assert self.down is not None
        carry = b""
        try:
            while True:
                if data:
                    chunk = carry + data
                    n = chunk.count(PONG)
                    if not self.hellos and HELLO_REPLY in chunk:
                        self.hellos += 1
                    if n:
                        self.pongs += n
                        if self.pongs >= self.target:
                            self.arrived.set()
                    carry = chunk[-(len(PONG) - 1):]
                data = self.down.recv(262144)
                if not data:
                    self.error = self.error or "downstream closed by the server"
                    self.arrived.set()
                    return
        except OSError as exc:
            self.error = self.error or f"downstream: {exc!r}"
            self.arrived.set()

    @staticmethod
    def chunk(envelopes: list[str]) -> bytes:
        """The envelopes as NDJSON lines in one chunk of a chunked request body."""
        body = ndjson(envelopes)
        return b"%x\r\n%s\r\n" % (len(body), body)

    def post(self, envelopes: list[str]) -> None:
        if self.duplex:  # the open stream's own body
            self.up.sendall(self.chunk(envelopes))
            return
        body = ndjson(envelopes)
        path = "/proto/sse" if self.cfg["transport"] == "sse" else "/proto/stream"
        self.up.sendall((f"POST {path}?session={self.session_id} HTTP/1.1\r\n"
                         f"Host: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
                         "Content-Type: application/x-ndjson\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        status, headers, rest = read_head(self.up, self.up_buf)
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            data = self.up.recv(65536)
            if not data:
                raise ConnectionError("upstream closed")
            rest += data
        self.up_buf = rest[length:]
        if status >= 300:
            raise ConnectionError(f"upstream POST answered {status}: {rest[:200]!r}")

    def close(self) -> None:
        for s in {self.up, self.down}:
            if s is None:
                continue
            try:
                s.close()
            except OSError:
                pass
        if self.reader is not None:
            self.reader.kill(block=False)


def main() -> None:
    cfg = {"transport": "sse", "connections": 10, "warmup": 1, "seconds": 5, "batch": 50,
           "serverPid": 0, "clkTck": os.sysconf("SC_CLK_TCK"),
           **json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")}
    n, batch = cfg["connections"], cfg["batch"]
    base = {"mode": "downstream", "transport": cfg["transport"], "connections": n,
            "batch": batch, "generator": "python"}
    t0 = time.perf_counter()
    sessions: list[Session] = []
    try:
        for i in range(n):
            s = Session(i, cfg)
            s.open()
            sessions.append(s)
    except (OSError, ConnectionError) as exc:
        for s in sessions:
            s.close()
        print(json.dumps({**base, "connected": len(sessions),
                          "error": f"could not open a {cfg['transport']} session: {exc}"}))
        return
    connect_s = time.perf_counter() - t0
    state = {"running": True, "counting": False, "messages": 0, "errors": 0,
             "first_error": None}
    latencies: list[float] = []

    def worker(s: Session) -> None:
        nonce = 0
        try:
            while state["running"]:
                frames = []
                for _ in range(batch):
                    nonce += 1
                    frames.append(s.envelope("PING", "SYSTEM", f'{{"nonce":"n{nonce}"}}'))
                s.target = s.pongs + batch
                s.arrived.clear()
                start = time.perf_counter()
                s.post(frames)
                while not s.floor and s.pongs < s.target and not s.error:
                    if not s.arrived.wait(10):
                        raise ConnectionError("PONGs did not arrive within 10 s")
                    s.arrived.clear()
                if s.error:
                    raise ConnectionError(s.error)
                if state["counting"]:
                    state["messages"] += batch
                    latencies.append(time.perf_counter() - start)
        except (OSError, ConnectionError) as exc:
            if state["running"]:
                state["errors"] += 1
                state["first_error"] = state["first_error"] or repr(exc)

    greenlets = [gevent.spawn(worker, s) for s in sessions]
    window, cpu, srv = measure(cfg, state)
    gevent.joinall(greenlets, timeout=2)
    for s in sessions:
        s.close()
    gevent.killall(greenlets, block=False)
    latencies.sort()
    def pick(q: float) -> float | None:
        return percentile_ms(latencies, q)

    msgs = state["messages"]
    print(json.dumps({
        **base, "connected": len(sessions), "connect_seconds": round(connect_s, 3),
        "window_s": round(window, 3), "messages": msgs,
        "messages_per_s": round(msgs / window, 1), "p50_ms": pick(0.5), "p99_ms": pick(0.99),
        "server_cpu_s": None if srv is None else round(srv, 3),
        "server_cpu_pct": None if srv is None else round(100 * srv / window, 1),
        "server_us_per_op": None if srv is None or not msgs else round(srv * 1e6 / msgs, 2),
        "gen_cpu_pct": round(100 * cpu / window, 1),
        "gen_us_per_op": round(cpu * 1e6 / msgs, 2) if msgs else None,
        "errors": state["errors"], "first_error": state["first_error"],
    }), flush=True)


if __name__ == "__main__":
    main()
