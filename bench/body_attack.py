"""Reproduce issue 24's attacks (docs/RELIABILITY.md, section 22) against
``gunicorn -k gevent`` (one worker, one attack per fresh server) and print what each
cost the worker and a bystander.

    python bench/body_attack.py                       # every attack, this checkout
    python bench/body_attack.py tiny-call user-texts  # some, by name
    python bench/body_attack.py --root /tmp/old       # another checkout (`git archive`)

Every attack runs in a process of its own (a thread of the bystander's would share its
interpreter lock, and the attacks compress and encode megabytes), while the bystander,
another user, probes ``/health``, a PING on a new WebSocket (connect, HELLO, PING) and a
PING on a session it already holds, again and again: first for 3 s with no attack (the
baseline, same server), then until the attack is over. Printed: the attack's own
figures, then each probe's p50 / p99 / max in ms, baseline and during.

* tiny-body: a session's owner POSTs 3 bodies of maxMessageSize holding 330,000 ``{}``
  each (every element answered with an ERROR), back to back.
* user-texts (``MAX_USER_BYTES`` 64 MiB): one user opens 4 sessions, each with 2 open
  texts of 4 parts of an emoji and 1,000,000 ASCII characters (1 MB of UTF-8, 4 MB as
  the str the server keeps), left open; then how many of the sessions are still open.
* user-calls (the ``sleep`` app of tests/fixtures/hardening_app.py, ``MAX_USER_BYTES``
  64 MiB): one user opens 4 sessions, each sending 12 calls of ``sleep`` 20 s whose
  params carry 100,000 ``{}`` (300 kB of JSON, about 7 MB of objects) and a run with
  the same metadata; how many were refused (MAX_RUNS_EXCEEDED).
* tiny-call (the ``sleep`` app, ``MAX_USER_BYTES`` 64 MiB): a flood: for 10 s
  (``--seconds``) one session sends calls whose params hold 300,000 ``{}`` (900 kB,
  deflated to about a kilobyte) back to back, each followed by a PING, at most 16 not
  yet answered (so the worker's backlog ends with the flood).
* tiny-call-many: the same flood from 8 connections of the same user at once.
* resume-churn: one user opens a session and resumes it 50 times over WebSockets that
  never answer the server's close frame; then how many connections the worker counts.

Worker CPU and RSS are read from /proc before and after each attack.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import orjson
import requests
from websockets.sync.client import connect as ws_connect

from budget_attacks import HELLO, Server, env  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
SECONDS = 10.0  # tiny-call's flood (--seconds)


def session_of(server: Server) -> tuple[object, str]:
    ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token={server.token}",
                    open_timeout=30, max_size=None).__enter__()
    ws.send(orjson.dumps(env(1, "HELLO", payload=HELLO)).decode())
    while True:
        msg = orjson.loads(ws.recv(timeout=30))
        if msg["type"] == "HELLO":
            return ws, msg["payload"]["session"]


def tiny_body(server: Server) -> str:
    ws, session = session_of(server)
    body = b"[" + b",".join([b"{}"] * 330_000) + b"]"
    took = []
    for _ in range(3):
        t0 = time.monotonic()
        requests.post(f"{server.url}/proto/sse?session={session}", data=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.token}"})
        took.append(time.monotonic() - t0)
    ws.close()
    return "3 POSTs of " + ", ".join(f"{t:.2f}" for t in took) + " s"


def user_texts(server: Server) -> str:
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
    for ws in clients:
        ws.close()
    return f"{alive} of 4 sessions still open"


def user_calls(server: Server) -> str:
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
    for ws in clients:
        ws.close()
    return f"{refused} of 52 calls and runs refused (MAX_RUNS_EXCEEDED)"


def call_flood(server: Server, seconds: float, out: list[tuple[int, int]]) -> None:
    """One connection's flood of costly calls (tiny-call)."""
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
        msg = orjson.loads(ws.recv(timeout=300))
        if msg["type"] == "ERROR":
            refused += 1
        elif msg["type"] == "PONG":
            answered += 1
    out.append((sent, refused))
    ws.close()


def tiny_call(server: Server, connections: int = 1) -> str:
    out: list[tuple[int, int]] = []
    t0 = time.monotonic()
    floods = [threading.Thread(target=call_flood, args=(server, SECONDS, out))
              for _ in range(connections)]
    for flood in floods:
        flood.start()
    for flood in floods:
        flood.join()
    sent, refused = sum(s for s, _ in out), sum(r for _, r in out)
    return (f"{sent} calls on {connections} connection(s), all answered after "
            f"{time.monotonic() - t0:.1f} s ({refused} refused)")


def tiny_call_many(server: Server) -> str:
    return tiny_call(server, 8)


def resume_churn(server: Server) -> str:
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
    for sock, _ in socks:
        sock.close()
    ws.close()
    return (f"50 resumes answered {statuses}; the worker counted "
            f"{vitals['activeConnections'] - 1} live connections of the attacker's "
            "(maxConnectionsPerUser: 100)")


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

    def probe_while(self, busy: Callable[[], bool]) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"health": [], "new ws PING": [], "PING": []}
        while busy():
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


def _run(attack: Callable[[Server], str], server: Server, out: "multiprocessing.Queue") -> None:
    out.put(attack(server))


def probed(name: str, attack: Callable[[Server], str], server: Server) -> None:
    bystander = Bystander(server)
    until = time.monotonic() + 3
    baseline = bystander.probe_while(lambda: time.monotonic() < until)
    results: multiprocessing.Queue = multiprocessing.Queue()
    cpu0, rss0 = server.cpu(), server.rss_mib()
    child = multiprocessing.Process(target=_run, args=(attack, server, results))
    child.start()
    during = bystander.probe_while(child.is_alive)
    print(f"{name}: {results.get(timeout=10)}; worker CPU {server.cpu() - cpu0:.1f} s, "
          f"RSS {rss0:.0f} -> {server.rss_mib():.0f} MiB\n"
          f"  baseline: {spread(baseline)}\n  attack:   {spread(during)}", flush=True)
    bystander.close()


def main() -> None:
    global SECONDS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=HERE.parent)
    parser.add_argument("--seconds", type=float, default=SECONDS, help="tiny-call's flood")
    parser.add_argument("attacks", nargs="*", help="tiny-body user-texts user-calls "
                        "tiny-call tiny-call-many resume-churn (default: all)")
    args = parser.parse_args()
    SECONDS = args.seconds
    attacks = {"tiny-body": tiny_body, "user-texts": user_texts, "user-calls": user_calls,
               "tiny-call": tiny_call, "tiny-call-many": tiny_call_many,
               "resume-churn": resume_churn}
    for name in args.attacks or attacks:
        extra = {"MAX_USER_BYTES": str(64 << 20)} \
            if name.startswith(("user", "tiny-call")) else None
        app = ("hardening_app:app", "tests/fixtures") \
            if name.startswith(("user-calls", "tiny-call")) else ("wsgi:app", ".")
        server = Server(args.root.resolve(), extra, *app)
        try:
            probed(name, attacks[name], server)
        finally:
            server.proc.terminate()
            server.proc.wait(30)


if __name__ == "__main__":
    main()
