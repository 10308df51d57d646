"""Python load generator (gevent + the `websockets` sans-I/O ClientProtocol), PING mode only.

    python bench/loadgen_py.py '<json config>'

Same config and result JSON as bench/loadgen.mjs for ``mode: "ping"`` (both ``proto``
"proto" and "echo"). bench/run.py uses it (1) in its generator check, to show by
measurement why the Node generator is the default, and (2) as a fallback when Node.js or
its ``ws`` package is unavailable.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import orjson  # noqa: E402
from gevent.pool import Pool  # noqa: E402
from websockets.client import ClientProtocol  # noqa: E402
from websockets.frames import Opcode  # noqa: E402
from websockets.uri import parse_uri  # noqa: E402
from _proc import measure, percentile_ms  # noqa: E402

SESSION = "0123456789abcdef0123456789abcdef"
NONCE_PAD = "------------------------------"
HELLO = orjson.dumps({"proto_version": "1.1.2", "accept_major": [1], "accept_events": [],
                      "capabilities": {"flow_control": {
                          "initial_credit_messages": 1_000_000_000,
                          "initial_credit_bytes": 1_000_000_000_000}}}).decode()


class Conn:
    def __init__(self, idx: int, url: str, proto: str) -> None:
        self.idx = idx
        self.seq = 0
        uri = parse_uri(url)
        self.sock = socket.create_connection((uri.host, uri.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = ClientProtocol(uri, max_size=None)
        self.proto.send_request(self.proto.connect())
        self._flush()
        while self.proto.state.name == "CONNECTING":
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed during the upgrade")
            self.proto.receive_data(data)
        if self.proto.handshake_exc:
            raise self.proto.handshake_exc
        self.proto.events_received()
        if proto == "proto":
            self.send(self.envelope("HELLO", "SYSTEM", HELLO))
            while self.recv()["type"] != "HELLO":
                pass

    def envelope(self, type: str, channel: str, payload: str) -> str:
        self.seq += 1
        return (f'{{"id":"c{self.idx}-{self.seq}","session":"{SESSION}","seq":"{self.seq}",'
                f'"ts":"{int(time.time() * 1000)}","type":"{type}","channel":"{channel}",'
                f'"payload":{payload}}}')

    def ping_frame(self) -> str:
        nonce = (f"n{self.seq + 1}" + NONCE_PAD)[:30]
        return self.envelope("PING", "SYSTEM", f'{{"nonce":"{nonce}"}}')

    def _flush(self) -> None:
        out = self.proto.data_to_send()
        if out:
            self.sock.sendall(b"".join(out))

    def send(self, text: str) -> None:
        self.proto.send_text(text.encode())
        self._flush()

    def recv_raw(self) -> bytes:
        while True:
            for frame in self.proto.events_received():
                if frame.opcode is Opcode.TEXT:
                    return frame.data
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed")
            self.proto.receive_data(data)

    def recv(self) -> dict:
        return orjson.loads(self.recv_raw())


def main() -> None:
    cfg = {"mode": "ping", "proto": "proto", "connections": 1, "warmup": 1, "seconds": 5,
           "serverPid": 0, "clkTck": os.sysconf("SC_CLK_TCK"), "connectConcurrency": 64,
           **json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")}
    if cfg["mode"] != "ping":
        raise SystemExit("loadgen_py.py only implements mode 'ping'")
    n = cfg["connections"]
    conns: list[Conn] = []
    errors: list[str] = []
    t0 = time.perf_counter()

    def open_one(i: int) -> None:
        try:
            conns.append(Conn(i, cfg["url"], cfg["proto"]))
        except Exception as exc:  # noqa: BLE001 - reported in the result
            errors.append(repr(exc))

    Pool(cfg["connectConcurrency"]).map(open_one, range(n))
    connect_seconds = time.perf_counter() - t0
    base = {"mode": "ping", "proto": cfg["proto"], "connections": n, "connected": len(conns),
            "connect_failed": len(errors), "connect_error": errors[-1] if errors else None,
            "connect_seconds": round(connect_seconds, 3),
            "connect_per_s": round(len(conns) / connect_seconds, 1), "generator": "python"}
    if not conns:
        print(json.dumps({**base, "error": "no connection could be opened"}), flush=True)
        return
    state = {"running": True, "counting": False, "replies": 0, "errors": 0, "first_error": None}
    latencies: list[float] = []
    echo = cfg["proto"] == "echo"

    def worker(c: Conn) -> None:
        try:
            while state["running"]:
                start = time.perf_counter()
                c.send(c.ping_frame())
                while True:
                    raw = c.recv_raw()
                    if echo:
                        break
                    msg = orjson.loads(raw)
                    if msg["type"] == "PONG":
                        break
                    if msg["type"] == "PING":
                        c.send(c.envelope("PONG", "SYSTEM",
                                          orjson.dumps({"nonce": msg["payload"].get("nonce")})
                                          .decode()))
                    elif msg["type"] == "ERROR":
                        state["errors"] += 1
                        state["first_error"] = state["first_error"] or str(msg["payload"])
                if state["counting"]:
                    latencies.append(time.perf_counter() - start)
                    state["replies"] += 1
        except (OSError, ConnectionError) as exc:
            if state["running"]:
                state["errors"] += 1
                state["first_error"] = state["first_error"] or repr(exc)

    greenlets = [gevent.spawn(worker, c) for c in conns]
    window, cpu, srv = measure(cfg, state)
    gevent.joinall(greenlets, timeout=0.5)
    for c in conns:
        c.sock.close()
    gevent.killall(greenlets, block=False)
    latencies.sort()

    def pick(q: float) -> float | None:
        return percentile_ms(latencies, q)

    replies = state["replies"]
    print(json.dumps({
        **base, "window_s": round(window, 3), "replies": replies,
        "rt_per_s": round(replies / window, 1), "p50_ms": pick(0.5), "p90_ms": pick(0.9),
        "p99_ms": pick(0.99), "max_ms": round(latencies[-1] * 1000, 3) if latencies else None,
        "server_cpu_s": None if srv is None else round(srv, 3),
        "server_cpu_pct": None if srv is None else round(100 * srv / window, 1),
        "server_us_per_op": None if srv is None or not replies else round(srv * 1e6 / replies, 2),
        "gen_cpu_pct": round(100 * cpu / window, 1),
        "gen_us_per_op": round(cpu * 1e6 / replies, 2) if replies else None,
        "errors": state["errors"], "first_error": state["first_error"], "closed_early": 0,
        "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }), flush=True)


if __name__ == "__main__":
    main()
