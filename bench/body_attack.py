"""Reproduce issue 24's body and resume attacks (docs/RELIABILITY.md, "issue 24") against
``gunicorn -k gevent wsgi:app`` and print what they cost the bystander.

    python bench/body_attack.py                 # this checkout
    python bench/body_attack.py --root /tmp/old # another checkout (e.g. `git archive`)

* tiny-body: a session's owner POSTs one body of maxMessageSize holding 330,000 ``{}``
  (each answered with an ERROR) while a bystander probes ``/health`` and a PING on a new
  WebSocket, again and again until the POST is answered: the POST's duration and the
  bystander's slowest probe (and how many probes were answered during the POST).
* user-texts (with ``MAX_USER_BYTES=67108864``, 64 MiB): one user opens 4 sessions, each
  with 2 open texts of 4 parts of an emoji and 1,000,000 ASCII characters (1 MB of
  UTF-8, 4 MB as the str the server keeps), left open; worker RSS before and after, and
  how many of the user's sessions are still open.
* user-calls (tests/fixtures/hardening_app.py's ``sleep`` tool, ``MAX_USER_BYTES`` 64
  MiB): one user opens 4 sessions, each sending 12 calls of ``sleep`` 20 s whose params
  carry 100,000 ``{}`` (300 kB of JSON, about 7 MB of objects), 2 running and 10 queued
  a session; a run with the same metadata; worker RSS before and after, how many calls
  were refused (MAX_RUNS_EXCEEDED) and the bystander's probe.
* tiny-call (the ``sleep`` app, ``MAX_USER_BYTES`` 64 MiB): a flood: for 10 s
  (``--seconds``) one session sends calls of ``sleep`` whose params hold 300,000 ``{}``
  (900 kB, deflated to about a kilobyte) back to back, each followed by a PING, at most
  16 not yet answered; a bystander (another user) probes ``/health``, a PING on a new
  WebSocket and a PING on its own session, first for 5 s with no attack (the baseline,
  same server), then until the flood's last PING is answered: each probe's p50 / p99 /
  max, how many calls were refused, worker CPU and RSS.
* resume-churn: one user opens a session and resumes it 50 times over WebSockets that
  never answer the server's close frame; then how many connections the worker counts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import threading
import time
from pathlib import Path

import orjson
import requests
from websockets.sync.client import connect as ws_connect

from budget_attacks import HELLO, Server, env  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent


def session_of(server: Server) -> tuple[object, str]:
    ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token={server.token}",
                    open_timeout=30, max_size=None).__enter__()
    ws.send(orjson.dumps(env(1, "HELLO", payload=HELLO)).decode())
    while True:
        msg = orjson.loads(ws.recv(timeout=30))
        if msg["type"] == "HELLO":
            return ws, msg["payload"]["session"]


def tiny_body(server: Server) -> None:
    ws, session = session_of(server)
    body = b"[" + b",".join([b"{}"] * 330_000) + b"]"
    done = threading.Event()
    took: list[float] = []

    def post() -> None:
        t0 = time.monotonic()
        requests.post(f"{server.url}/proto/sse?session={session}", data=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.token}"})
        took.append(time.monotonic() - t0)
        done.set()

    cpu0, rss0 = server.cpu(), server.rss_mib()
    threading.Thread(target=post, daemon=True).start()
    time.sleep(0.05)
    probes = []
    while not done.is_set():
        health, ping = server.probe()
        if not done.is_set():
            probes.append(max(health, ping))
    print(f"tiny-body: POST {took[0]:.2f} s, worker CPU {server.cpu() - cpu0:.2f} s, "
          f"RSS {rss0:.0f} -> {server.rss_mib():.0f} MiB; bystander probes answered during "
          f"it: {len(probes)}, slowest {max(probes, default=float('nan')) * 1000:.0f} ms")
    ws.close()


def user_texts(server: Server) -> None:
    rss0 = server.rss_mib()
    clients = []
    for _ in range(4):
        ws, _session = session_of(server)
        clients.append(ws)
        for t in range(2):
            mid = f"t{t}"
            ws.send(orjson.dumps(env(10 + t, "MESSAGE_START", "USER", {
                "message_id": mid, "content_type": "text/plain"})).decode())
            for p in range(4):
                ws.send(orjson.dumps(env(20 + 10 * t + p, "MESSAGE_PART", "USER", {
                    "message_id": mid, "content": "\U0001F600" + "x" * 1_000_000})).decode())
    time.sleep(3)  # two heartbeat ticks at least
    alive = 0
    for ws in clients:
        try:
            ws.send(orjson.dumps(env(99, "PING", payload={"nonce": "n"})).decode())
            while orjson.loads(ws.recv(timeout=10))["type"] != "PONG":
                pass
            alive += 1
        except Exception:  # noqa: BLE001 - closed by the budget
            pass
    health, ping = server.probe()
    print(f"user-texts: RSS {rss0:.0f} -> {server.rss_mib():.0f} MiB; {alive} of 4 sessions "
          f"still open; bystander /health {health * 1000:.0f} ms, PING {ping * 1000:.0f} ms")
    for ws in clients:
        ws.close()


def user_calls(server: Server) -> None:
    rss0 = server.rss_mib()
    pad = [{}] * 100_000
    clients, refused = [], 0
    for _ in range(4):
        ws, _session = session_of(server)
        clients.append(ws)
        for i in range(12):
            ws.send(orjson.dumps(env(10 + i, "TOOL_CALL", "AGENT", {
                "call_id": f"c{i}", "tool": "sleep",
                "params": {"seconds": 20, "pad": pad}})).decode())
        ws.send(orjson.dumps(env(30, "RUN_STARTED", "SYSTEM", {
            "run_id": "r", "metadata": {"pad": pad}})).decode())
        ws.send(orjson.dumps(env(31, "PING", payload={"nonce": "n"})).decode())
        while True:
            msg = orjson.loads(ws.recv(timeout=60))
            if msg["type"] == "ERROR" and msg["payload"]["code"] == "MAX_RUNS_EXCEEDED":
                refused += 1
            if msg["type"] == "PONG":
                break
    time.sleep(2)
    health, ping = server.probe()
    print(f"user-calls: RSS {rss0:.0f} -> {server.rss_mib():.0f} MiB; {refused} of 52 calls "
          f"and runs refused (MAX_RUNS_EXCEEDED); bystander /health {health * 1000:.0f} ms, "
          f"PING {ping * 1000:.0f} ms")
    for ws in clients:
        ws.close()


class Bystander:
    """A user not in the attack: ``/health``, a PING on a new WebSocket (connect, HELLO,
    PING) and a PING on a session it already holds, probed again and again."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token="
                             f"{server.other}", open_timeout=30, max_size=None).__enter__()
        self.seq = 1
        self.ws.send(orjson.dumps(env(1, "HELLO", payload=HELLO)).decode())
        while orjson.loads(self.ws.recv(timeout=30))["type"] != "HELLO":
            pass

    def session_ping(self) -> float:
        self.seq += 1
        t0 = time.monotonic()
        self.ws.send(orjson.dumps(env(self.seq, "PING", payload={"nonce": "b"})).decode())
        while orjson.loads(self.ws.recv(timeout=60))["type"] != "PONG":
            pass
        return time.monotonic() - t0

    def probe_until(self, done: threading.Event, seconds: float | None = None
                    ) -> dict[str, list[float]]:
        """Probe until ``done`` is set (or for ``seconds``): each kind's times."""
        times: dict[str, list[float]] = {"health": [], "new ws PING": [], "PING": []}
        until = time.monotonic() + seconds if seconds else None
        while not done.is_set() and (until is None or time.monotonic() < until):
            health, ping = self.server.probe()
            times["health"].append(health)
            times["new ws PING"].append(ping)
            times["PING"].append(self.session_ping())
        return times

    def close(self) -> None:
        self.ws.close()


def spread(times: dict[str, list[float]]) -> str:
    """p50 / p99 / max in ms of each kind of probe."""
    out = []
    for kind, values in times.items():
        values = sorted(values)
        if not values:
            continue
        p50 = values[len(values) // 2]
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        out.append(f"{kind} {p50 * 1000:.0f}/{p99 * 1000:.0f}/{values[-1] * 1000:.0f}")
    return f"{len(next(iter(times.values())))} probes, p50/p99/max ms: " + ", ".join(out)


def call_flood(port: int, token: str, seconds: float, out: "multiprocessing.Queue") -> None:
    """tiny-call's attacker, in a process of its own (a thread of the bystander's would
    share its interpreter lock, and compressing 900 kB a call keeps it)."""
    server = Server.__new__(Server)
    server.port, server.token = port, token
    ws, _session = session_of(server)
    pad = orjson.dumps([{}] * 300_000).decode()
    t0, refused, sent, answered = time.monotonic(), 0, 0, 0
    while time.monotonic() - t0 < seconds or answered < sent:
        if sent - answered < 16 and time.monotonic() - t0 < seconds:
            ws.send(f'{{"id":"c{sent}","session":"","seq":"{10 + 2 * sent}","ts":"1",'
                    f'"type":"TOOL_CALL","channel":"AGENT","payload":{{"call_id":'
                    f'"c{sent}","tool":"sleep","params":{{"seconds":20,"pad":{pad}}}}}}}')
            ws.send(orjson.dumps(env(11 + 2 * sent, "PING", payload={"nonce": "n"})).decode())
            sent += 1
            continue
        msg = orjson.loads(ws.recv(timeout=120))
        if msg["type"] == "ERROR":
            refused += 1
        elif msg["type"] == "PONG":
            answered += 1
    out.put((time.monotonic() - t0, refused, sent))
    ws.close()


def tiny_call(server: Server, seconds: float = 10.0) -> None:
    """A flood: for ``seconds``, calls of 300,000 ``{}`` back to back (at most 16 not yet
    answered, so that the worker's backlog ends with the flood); a bystander probes
    before (the baseline, same server) and during it."""
    bystander = Bystander(server)
    baseline = bystander.probe_until(threading.Event(), seconds=min(seconds, 5.0))
    results: multiprocessing.Queue = multiprocessing.Queue()
    cpu0, rss0 = server.cpu(), server.rss_mib()
    flood = multiprocessing.Process(target=call_flood,
                                    args=(server.port, server.token, seconds, results))
    flood.start()
    done = threading.Event()
    threading.Thread(target=lambda: (flood.join(), done.set()), daemon=True).start()
    during = bystander.probe_until(done)
    took, refused, sent = results.get(timeout=10)
    print(f"tiny-call: {sent} calls in {took:.1f} s ({refused} refused), worker CPU "
          f"{server.cpu() - cpu0:.1f} s, RSS {rss0:.0f} -> {server.rss_mib():.0f} MiB\n"
          f"  baseline: {spread(baseline)}\n  attack:   {spread(during)}")
    bystander.close()


def resume_churn(server: Server) -> None:
    ws, session = session_of(server)
    socks = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall((f"GET /proto/websocket?token={server.token}&session={session}"
                      "&last_seq=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        socks.append((sock, head.split(b" ", 2)[1]))
    vitals = requests.get(server.url + "/debug/vitals", timeout=30).json()
    statuses = sorted({s.decode() for _, s in socks})
    print(f"resume-churn: 50 resumes answered {statuses}; the worker counts "
          f"{vitals['activeConnections']} live connections (maxConnectionsPerUser: 100)")
    for sock, _ in socks:
        sock.close()
    ws.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=HERE.parent)
    parser.add_argument("attacks", nargs="*", help="tiny-body user-texts user-calls "
                        "resume-churn (default: all)")
    args = parser.parse_args()
    attacks = {"tiny-body": tiny_body, "user-texts": user_texts, "user-calls": user_calls,
               "tiny-call": tiny_call, "resume-churn": resume_churn}
    for name in args.attacks or attacks:
        attack = attacks[name]
        extra = {"MAX_USER_BYTES": str(64 << 20)} \
            if name.startswith("user") or attack is tiny_call else None
        app = ("hardening_app:app", "tests/fixtures") if attack in (user_calls, tiny_call) \
            else ("wsgi:app", ".")
        server = Server(args.root.resolve(), extra, *app)
        try:
            attack(server)
        finally:
            server.proc.terminate()
            server.proc.wait(30)


if __name__ == "__main__":
    main()
