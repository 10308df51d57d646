"""Reproduce the per-session memory and CPU attacks of docs/RELIABILITY.md (section 21)
against ``gunicorn -k gevent wsgi:app`` and print what each cost the worker.

    python bench/budget_attacks.py                 # this checkout
    python bench/budget_attacks.py --root /tmp/old # another checkout (e.g. `git archive`)

Attacks (each on a fresh server, so one's memory does not hide the next's):

* replay-ws / replay-stream: fill the replay window (1000 echoed messages), then send
  400 REPLAY_REQUEST {from_seq: 1} (about 60 kB) and never read again.
* window-bytes: POST 1 MB texts into a disconnected session (each echo is a 1 MB entry).
* hello-errors: one 0.75 MB HELLO whose accept_major has 250k bad elements; a PING from
  another connection right after.

For each: worker RSS before and after (from /debug/vitals), the worker's CPU seconds, the
size of the largest frame or reply where it matters, and how long /health and a PING on a
new connection took during the attack.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import orjson
import requests
from websockets.sync.client import connect as ws_connect

HERE = Path(__file__).resolve().parent
SECRET = "budget-attacks-secret-of-32-bytes-or-more"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def env(seq: int, type: str, channel: str = "SYSTEM", payload: dict | None = None,
        session: str = "") -> dict:
    return {"id": f"c{seq}", "session": session, "seq": str(seq), "ts": "1", "type": type,
            "channel": channel, "payload": payload or {}}


HELLO = {"proto_version": "1.1.2", "accept_major": [1], "accept_events": []}


class Server:
    def __init__(self, root: Path, extra_env: dict[str, str] | None = None,
                 app: str = "wsgi:app", chdir: str = ".") -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        self.listener = listener
        self.port = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
                    "PROTOFLASK_DEBUG_VITALS": "true", "PYTHONPATH": str(root),
                    **(extra_env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(root / "gunicorn.conf.py"),
             "--bind", f"fd://{listener.fileno()}", "--chdir", str(root / chdir), app],
            pass_fds=(listener.fileno(),), env=full_env, cwd=root, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("gunicorn did not start")
            time.sleep(0.2)
        sys.path.insert(0, str(root))
        from protoflask.auth import TokenAuthority  # noqa: E402 (the checkout's own)

        self.token = TokenAuthority(SECRET).issue("attacker")
        self.other = TokenAuthority(SECRET).issue("bystander")

    def worker_pid(self) -> int:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
                             capture_output=True, text=True).stdout.split()
        return int(out[0])

    def cpu(self) -> float:
        with open(f"/proc/{self.worker_pid()}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mib(self) -> float:
        try:
            with open(f"/proc/{self.worker_pid()}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, IndexError, ValueError):
            pass
        return float("nan")

    def probe(self) -> tuple[float, float]:
        """Seconds for /health, and for a PING answered on a new WebSocket."""
        t0 = time.monotonic()
        try:
            requests.get(self.url + "/health", timeout=30)
        except requests.RequestException:
            return float("inf"), float("inf")
        health = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            with ws_connect(f"ws://127.0.0.1:{self.port}/proto/websocket?token={self.other}",
                            open_timeout=30, max_size=None) as ws:
                ws.send(orjson.dumps(env(1, "HELLO", payload=HELLO)).decode())
                ws.send(orjson.dumps(env(2, "PING", payload={"nonce": "probe"})).decode())
                while True:
                    msg = json.loads(ws.recv(timeout=30))
                    if msg["type"] == "PONG":
                        break
        except Exception:  # noqa: BLE001 - a probe that fails is a figure too
            return health, float("inf")
        return health, time.monotonic() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.listener.close()


def fill_window(ws, count: int = 333, size: int = 2000) -> int:
    """Echoed texts until the window holds about 3 * count messages; returns the last seq."""
    seq = 1
    ws.send(orjson.dumps(env(seq, "HELLO", payload=HELLO)).decode())
    content = "x" * size
    for i in range(count):
        mid = f"m{i}"
        for type, payload in (("MESSAGE_START", {"message_id": mid, "content_type": "text/plain"}),
                              ("MESSAGE_PART", {"message_id": mid, "content": content}),
                              ("MESSAGE_END", {"message_id": mid})):
            seq += 1
            ws.send(orjson.dumps(env(seq, type, "USER", payload)).decode())
    ends = 0
    while ends < count:  # read every echo (and the HELLO, FLOW_UPDATEs)
        msg = json.loads(ws.recv(timeout=30))
        ends += msg["type"] == "MESSAGE_END"
    return seq


def replay_requests(first_seq: int, n: int = 400) -> list[dict]:
    return [env(first_seq + i, "REPLAY_REQUEST", payload={"from_seq": "1"}) for i in range(n)]


def attack_replay_ws(server: Server) -> dict:
    ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token={server.token}",
                    max_size=None, compression=None)
    seq = fill_window(ws)
    rss0, cpu0 = server.rss_mib(), server.cpu()
    frames = [orjson.dumps(e).decode() for e in replay_requests(seq + 1)]
    # never read again: shrink our receive buffer so the server's writes block soon
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for frame in frames:
        ws.send(frame)
    wire = sum(len(f) for f in frames)
    peak = rss0
    for _ in range(10):
        time.sleep(0.5)
        peak = max(peak, server.rss_mib())
    health, ping = server.probe()
    out = {"attack": "replay-ws", "sent_bytes": wire, "rss_before_mib": round(rss0, 1),
           "rss_peak_mib": round(peak, 1), "worker_cpu_s": round(server.cpu() - cpu0, 2),
           "health_s": round(health, 3), "ping_s": round(ping, 3)}
    ws.socket.close()
    return out


def attack_replay_stream(server: Server) -> dict:
    # open a duplex stream: HELLO and the echoes on the response, then stop reading
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.sendall((f"POST /proto/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{server.token}\r\nTransfer-Encoding: chunked\r\n"
                  "Content-Type: application/x-ndjson\r\n\r\n").encode())

    def chunk(data: bytes) -> None:
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    lines = [env(1, "HELLO", payload=HELLO)]
    seq = 1
    for i in range(333):
        mid = f"m{i}"
        for type, payload in (("MESSAGE_START", {"message_id": mid, "content_type": "text/plain"}),
                              ("MESSAGE_PART", {"message_id": mid, "content": "x" * 2000}),
                              ("MESSAGE_END", {"message_id": mid})):
            seq += 1
            lines.append(env(seq, type, "USER", payload))
    head = b""
    chunk(b"".join(orjson.dumps(e) + b"\n" for e in lines[:1]))
    while b"\r\n\r\n" not in head:
        head += sock.recv(65536)
    session = [line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
               if line.lower().startswith(b"proto-session:")][0]
    for e in lines[1:]:
        chunk(orjson.dumps(e) + b"\n")
    # read the echoes (about 1000 lines) so the window is full and nothing is pending
    got = head.partition(b"\r\n\r\n")[2]
    sock.settimeout(2)
    try:
        while got.count(b'"MESSAGE_END"') < 333:
            got += sock.recv(1 << 20)
    except socket.timeout:
        pass
    rss0, cpu0 = server.rss_mib(), server.cpu()
    body = b"".join(orjson.dumps(e) + b"\n" for e in replay_requests(seq + 1))
    requests.post(f"{server.url}/proto/stream?session={session}", data=body, timeout=30,
                  headers={"Authorization": f"Bearer {server.token}"})
    peak = rss0
    for _ in range(10):
        time.sleep(0.5)
        peak = max(peak, server.rss_mib())
    health, ping = server.probe()
    sock.close()
    return {"attack": "replay-stream", "sent_bytes": len(body), "rss_before_mib": round(rss0, 1),
            "rss_peak_mib": round(peak, 1), "worker_cpu_s": round(server.cpu() - cpu0, 2),
            "health_s": round(health, 3), "ping_s": round(ping, 3)}


def attack_window_bytes(server: Server, texts: int = 120) -> dict:
    ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token={server.token}",
                    max_size=None)
    ws.send(orjson.dumps(env(1, "HELLO", payload=HELLO)).decode())
    hello = json.loads(ws.recv(timeout=30))
    session = hello["session"]
    ws.close()
    rss0, cpu0 = server.rss_mib(), server.cpu()
    content = "y" * (1_000_000)
    seq = 1
    auth = {"Authorization": f"Bearer {server.token}"}
    t0 = time.monotonic()
    with requests.Session() as http:
        for i in range(texts):
            mid = f"big{i}"
            for type, payload in (
                    ("MESSAGE_START", {"message_id": mid, "content_type": "text/plain"}),
                    ("MESSAGE_PART", {"message_id": mid, "content": content}),
                    ("MESSAGE_END", {"message_id": mid})):
                seq += 1
                http.post(f"{server.url}/proto/sse?session={session}", headers=auth,
                          data=orjson.dumps(env(seq, type, "USER", payload, session)),
                          timeout=60)
    elapsed = time.monotonic() - t0
    rss1 = server.rss_mib()
    health, ping = server.probe()
    return {"attack": "window-bytes", "texts_of_1MB": texts, "seconds": round(elapsed, 1),
            "rss_before_mib": round(rss0, 1), "rss_after_mib": round(rss1, 1),
            "worker_cpu_s": round(server.cpu() - cpu0, 2), "health_s": round(health, 3),
            "ping_s": round(ping, 3)}


def attack_hello_errors(server: Server) -> dict:
    ws = ws_connect(f"ws://127.0.0.1:{server.port}/proto/websocket?token={server.token}",
                    max_size=None)
    frame = orjson.dumps(env(1, "HELLO", payload={"proto_version": "1.1.2",
                                                  "accept_major": [""] * 250_000,
                                                  "accept_events": []})).decode()
    cpu0 = server.cpu()
    probed: dict[str, float] = {}
    prober = threading.Thread(target=lambda: probed.update(zip(("health", "ping"),
                                                               server.probe(), strict=True)))
    ws.send(frame)
    prober.start()  # while the server works on the HELLO
    reply = ws.recv(timeout=60)
    cpu = server.cpu() - cpu0
    prober.join()
    health, ping = probed["health"], probed["ping"]
    ws.close()
    return {"attack": "hello-errors", "hello_bytes": len(frame), "reply_bytes": len(reply),
            "worker_cpu_s": round(cpu, 2), "health_s": round(health, 3),
            "ping_s": round(ping, 3)}


ATTACKS = {"replay-ws": attack_replay_ws, "replay-stream": attack_replay_stream,
           "window-bytes": attack_window_bytes, "hello-errors": attack_hello_errors}


def main() -> None:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent,
                        help="checkout to serve (default: this one)")
    parser.add_argument("attacks", nargs="*", help=f"some of {', '.join(ATTACKS)} (default all)")
    args = parser.parse_args()
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attack(s): {', '.join(sorted(unknown))}")
    for name in args.attacks or ATTACKS:
        server = Server(args.root.resolve())
        try:
            print(json.dumps(ATTACKS[name](server)), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
