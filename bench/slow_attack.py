"""Slow-request attacks against ``gunicorn -k gevent wsgi:app`` (issue 13, item 4).

    python bench/slow_attack.py [--root CHECKOUT] [--bodies 1150] [--users 12]
                                [--headers 1500] [--seconds 20]

Starts gunicorn from ``--root`` (its gunicorn.conf.py and its protoflask, via PYTHONPATH;
default: this checkout) on a free port, then, at once:

* ``--bodies`` authenticated POSTs to ``/proto/sse?session=...`` spread over ``--users``
  tokens, each announcing a 100 kB body and trickling it one byte a second;
* ``--headers`` unauthenticated connections that send a request line and then one header
  byte a second, never finishing the head (a header slowloris), reconnecting when cut.

Meanwhile it probes twice a second: ``GET /health`` (latency) and a new SSE connection
(time to its first event, with a token of a user not in the attack). Prints one JSON line:
probe latencies during the attack (p50, max, failures), how the slow bodies ended (status
codes, or still open), and the same probes 2 s after the attack stopped.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import jwt  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
SECRET = "slow-attack-secret-long-enough-for-hs256!!"


def token(user: str) -> str:
    return jwt.encode({"sub": user, "exp": int(time.time()) + 3600}, SECRET, "HS256")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(root: Path, port: int, env_extra: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
           "PYTHONPATH": str(root), "HOST": "127.0.0.1", "PORT": str(port), **env_extra}
    # cwd=root: ``python -m`` puts the working directory ahead of PYTHONPATH
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c",
                             str(root / "gunicorn.conf.py"), "--chdir", str(root),
                             "wsgi:app"], env=env, cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # never measure whatever else answers on that port
            raise SystemExit(f"gunicorn exited with {proc.returncode}")
        try:
            status, _ = http_get(port, "/health", 1.0)
            if status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("gunicorn did not start")


def http_get(port: int, path: str, limit: float) -> tuple[int, float]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
    return int(head.split(b" ", 2)[1]), time.monotonic() - started


def sse_first_event(port: int, tok: str, limit: float) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        s.sendall(f"GET /proto/sse HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n"
                  "\r\n".encode())
        data = b""
        while b"event: session" not in data:
            more = s.recv(4096)
            if not more:
                raise OSError(f"closed: {data[:80]!r}")
            data += more
    return time.monotonic() - started


def slow_body(port: int, tok: str, outcome: Counter, stop: gevent.event.Event) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(f"POST /proto/sse?session=nosuch HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {tok}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100000\r\n\r\n".encode())
        reader = gevent.spawn(s.recv, 64)
        while not stop.is_set():
            if reader.ready():
                head = reader.value or b""
                outcome[head.split(b" ", 2)[1].decode() if head else "closed"] += 1
                s.close()
                return
            try:
                s.send(b" ")
            except OSError:
                outcome["reset"] += 1
                return
            stop.wait(1.0)
        outcome["open at end"] += 1
        reader.kill()
        s.close()
    except OSError as exc:
        outcome[f"error {type(exc).__name__}"] += 1


def slowloris(port: int, counts: Counter, stop: gevent.event.Event) -> None:
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            counts["opened"] += 1
            while not stop.is_set():
                s.send(b"X")
                stop.wait(1.0)
            s.close()
        except OSError:
            counts["cut"] += 1
            stop.wait(0.2)


def probe(port: int, tok: str, seconds: float) -> dict:
    health, sse, failures = [], [], Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            health.append(http_get(port, "/health", 10.0)[1])
        except (OSError, ValueError, IndexError) as exc:
            failures[f"health {type(exc).__name__}"] += 1
        try:
            sse.append(sse_first_event(port, tok, 10.0))
        except OSError as exc:
            failures[f"sse {type(exc).__name__}"] += 1
        gevent.sleep(0.5)

    def summary(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"n": len(xs), "p50_ms": round(xs[len(xs) // 2] * 1000, 1) if xs else None,
                "max_ms": round(xs[-1] * 1000, 1) if xs else None}
    return {"health": summary(health), "new_sse": summary(sse), "failures": dict(failures)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=HERE)
    ap.add_argument("--bodies", type=int, default=1150)
    ap.add_argument("--users", type=int, default=12)
    ap.add_argument("--headers", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--body-timeout", default=None, help="BODY_TIMEOUT for the server (ms)")
    args = ap.parse_args()
    port = free_port()
    env = {"BODY_TIMEOUT": args.body_timeout} if args.body_timeout else {}
    proc = start_gunicorn(args.root.resolve(), port, env)
    try:
        stop = gevent.event.Event()
        outcome: Counter = Counter()
        loris: Counter = Counter()
        toks = [token(f"attacker{i}") for i in range(max(1, args.users))]
        workers = [gevent.spawn(slow_body, port, toks[i % len(toks)], outcome, stop)
                   for i in range(args.bodies)]
        workers += [gevent.spawn(slowloris, port, loris, stop) for _ in range(args.headers)]
        gevent.sleep(2.0)  # let the attack build up
        during = probe(port, token("bystander"), args.seconds)
        stop.set()
        gevent.joinall(workers, timeout=15)
        gevent.sleep(2.0)
        after = probe(port, token("bystander"), 3.0)
        print(json.dumps({"root": str(args.root), "bodies": args.bodies, "users": args.users,
                          "header_slowloris": args.headers, "seconds": args.seconds,
                          "during": during, "slow_bodies_ended": dict(outcome),
                          "slowloris": dict(loris), "after": after}))
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
