"""Redis faults under a two-node cluster: what clients see, and how long until it heals.

    python bench/cluster_faults.py                       # every fault, a table + JSON
    python bench/cluster_faults.py --fault script-flush --clients 5 --seconds 10

Starts a private redis-server (never the shared one: these faults flush and restart it)
and two nodes (``gunicorn -k gevent wsgi:app``, one worker each) on it. Each node has
``--clients`` WebSocket clients that PING every 100 ms and reconnect (new session) when
dropped. Two seconds in, the fault:

    script-flush   SCRIPT FLUSH (the journal's Lua script is gone)
    restart        redis-server killed and started again, empty
    wrong-type     a client's replay list replaced by a string (every append fails)

Reported per fault: PONGs per client in the ``--seconds`` after the fault (min / median),
disconnects per client, failed reconnects, and ``recovered_s``: from the fault until both
nodes' /health say "ok" *and* a new connection to each gets its HELLO and a PONG (capped
at --seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support import PrivateRedis  # noqa: E402  (the tests' private redis-server)
SECRET = "bench-secret-that-is-long-enough-for-hs256!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


class Node:
    def __init__(self, redis_url: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JWT_SECRET": SECRET, "REDIS_URL": redis_url,
               "ENABLE_LOGGING": "false", "HOST": "127.0.0.1", "PORT": str(self.port),
               "WEB_CONCURRENCY": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "wsgi:app"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait(lambda: self.health() is not None, 20, "gunicorn")

    def health(self) -> str | None:
        try:
            return str(requests.get(self.base + "/health", timeout=1).json()["status"])
        except (requests.RequestException, ValueError, KeyError):
            return None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def token(user: str) -> str:
    from protoflask.auth import TokenAuthority

    return TokenAuthority(SECRET, ("HS256",), "1h").issue(user)


def envelope(seq: int, type_: str, channel: str, payload: dict[str, Any]) -> str:
    return json.dumps({"id": f"c{seq}", "session": "", "seq": str(seq),
                       "ts": str(int(time.time() * 1000)), "type": type_, "channel": channel,
                       "payload": payload})


def handshake(base: str, tok: str) -> Any:
    ws = connect(base.replace("http", "ws") + f"/proto/websocket?token={tok}",
                 open_timeout=2).__enter__()
    ws.send(envelope(1, "HELLO", "SYSTEM", {"proto_version": "1.1.2", "accept_major": [1],
                                            "accept_events": []}))
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if json.loads(ws.recv(timeout=2))["type"] == "HELLO":
            return ws
    raise TimeoutError("no HELLO")


def ping_once(base: str, tok: str) -> bool:
    try:
        ws = handshake(base, tok)
        try:
            ws.send(envelope(2, "PING", "SYSTEM", {"nonce": "probe"}))
            deadline = time.monotonic() + 1
            while time.monotonic() < deadline:
                msg = json.loads(ws.recv(timeout=1))
                if msg["type"] == "PONG":
                    return True
        finally:
            ws.close()
    except Exception:  # noqa: BLE001 - any failure is "not recovered yet"
        return False
    return False


class Client(threading.Thread):
    def __init__(self, base: str, user: str, state: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.base, self.tok, self.state = base, token(user), state
        self.pongs = self.disconnects = self.failed_connects = 0

    def run(self) -> None:
        while self.state["running"]:
            try:
                ws = handshake(self.base, self.tok)
            except Exception:  # noqa: BLE001
                if self.state["counting"]:
                    self.failed_connects += 1
                time.sleep(0.1)
                continue
            seq = 1
            try:
                while self.state["running"]:
                    seq += 1
                    ws.send(envelope(seq, "PING", "SYSTEM", {"nonce": str(seq)}))
                    deadline = time.monotonic() + 0.1
                    while (left := deadline - time.monotonic()) > 0:
                        try:
                            msg = json.loads(ws.recv(timeout=left))
                        except TimeoutError:
                            break
                        if msg["type"] == "PONG" and self.state["counting"]:
                            self.pongs += 1
                ws.close()
            except Exception:  # noqa: BLE001 - dropped: count it and reconnect
                if self.state["counting"]:
                    self.disconnects += 1


def fault(name: str, private: PrivateRedis) -> None:
    r = redis.Redis.from_url(private.url)
    if name == "script-flush":
        r.script_flush()
    elif name == "restart":
        private.kill()
        time.sleep(0.5)
        private.start()
    elif name == "wrong-type":
        for key in r.scan_iter("protoflask:r:*"):
            r.delete(key)
            r.set(key, "not a list")
            break
    r.close()


def run_fault(name: str, clients: int, seconds: float) -> dict[str, Any]:
    private = PrivateRedis()
    nodes = [Node(private.url), Node(private.url)]
    state = {"running": True, "counting": False}
    workers = [Client(node.base, f"u{i}-{n}", state) for n, node in enumerate(nodes)
               for i in range(clients)]
    try:
        for w in workers:
            w.start()
        time.sleep(2)
        state["counting"] = True
        started = time.monotonic()
        fault(name, private)
        recovered = None
        probe = token("probe")
        while time.monotonic() - started < seconds:
            if all(n.health() == "ok" for n in nodes) and \
                    all(ping_once(n.base, probe) for n in nodes):
                recovered = round(time.monotonic() - started, 2)
                break
            time.sleep(0.05)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        state["counting"] = False
        pongs = sorted(w.pongs for w in workers)
        return {"fault": name, "clients": len(workers), "seconds": seconds,
                "recovered_s": recovered, "pongs_min": pongs[0],
                "pongs_median": statistics.median(pongs),
                "disconnects_per_client": round(
                    sum(w.disconnects for w in workers) / len(workers), 1),
                "failed_connects": sum(w.failed_connects for w in workers),
                "health_after": [n.health() for n in nodes]}
    finally:
        state["running"] = False
        for node in nodes:
            node.stop()
        private.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fault", choices=("script-flush", "restart", "wrong-type", "all"),
                        default="all")
    parser.add_argument("--clients", type=int, default=5, help="per node")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    names = ("script-flush", "restart", "wrong-type") if args.fault == "all" else (args.fault,)
    results = [run_fault(n, args.clients, args.seconds) for n in names]
    print("| fault | recovered (s) | PONGs/client min / median | disconnects/client | "
          "failed reconnects | /health after |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['fault']} | {r['recovered_s'] if r['recovered_s'] is not None else 'no'}"
              f" | {r['pongs_min']} / {r['pongs_median']} | {r['disconnects_per_client']} | "
              f"{r['failed_connects']} | {', '.join(map(str, r['health_after']))} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
