"""Instructions per connection of a reconnect storm in a real gunicorn worker, counted by
valgrind's callgrind (issue 29): repeatable to well under 1% whatever the neighbours do,
where the storm rows' CPU per connection moves by 20-30% on a shared machine.

    python bench/storm_instructions.py ws|sse|stream|resume [--n1 100] [--n2 600] [--root DIR]

Starts ``gunicorn -c DIR/gunicorn.conf.py wsgi:app`` (DIR: this checkout, or another
one, e.g. ``git archive main | tar -x -C DIR``) under callgrind with instrumentation off,
turns it on in the worker (``callgrind_control -i on``) for one bench/storm.py storm of
n connections (100 in flight, one user each) and off once every handshake is done, then
stops it. A storm of n1 and one of n2: the difference over n2 - n1 is one handshake's
instructions in user space (the kernel's share of its syscalls is not counted).
gunicorn's optional C parser is off (``--http-parser python``): valgrind does not know
its instructions (the head lane reads the storm's heads without it either way).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from _callgrind import gunicorn_under_callgrind, totals

BENCH = Path(__file__).resolve().parent
SECRET = "bench-secret-bench-secret-bench-secret!!"


def worker_instructions(root: Path, mode: str, n: int) -> int:
    """The worker's instructions over one storm of ``n`` handshakes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="protoflask-storm-cg-")
    env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
           "ENABLE_COMPRESSION": "false", "ECHO_MESSAGES": "false", "RATE_LIMIT": "0",
           "MAX_CONNECTIONS": str(n + 1000), "MAX_CONNECTIONS_PER_USER": str(n + 1000),
           "WEB_CONCURRENCY": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    env.pop("REDIS_URL", None)
    proc = gunicorn_under_callgrind(root, port, env, out, instr_at_start=False,
                                    extra=("--graceful-timeout", "600"))
    try:
        worker = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                text=True).stdout.split()[0]
        subprocess.run(["callgrind_control", "-i", "on", worker], capture_output=True)
        cfg = {"baseUrl": f"http://127.0.0.1:{port}", "mode": mode, "connections": n,
               "proto": "proto", "inflight": 100, "secret": SECRET, "timeout": 900,
               "serverPid": 0, "replay": 10}
        storm = subprocess.Popen([sys.executable, str(BENCH / "storm.py"), json.dumps(cfg)],
                                 cwd=BENCH, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        assert storm.stdout is not None and storm.stdin is not None
        ready = json.loads(storm.stdout.readline())
        subprocess.run(["callgrind_control", "-i", "off", worker], capture_output=True)
        storm.stdin.write("close\n")
        storm.stdin.close()
        storm.wait(120)
        if ready.get("connected") != n:
            raise SystemExit(f"the storm did not complete: {ready}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(600)
    return sum(totals(f"{out}/cg.{worker}*", "totals"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["ws", "sse", "stream", "resume"])
    p.add_argument("--n1", type=int, default=100)
    p.add_argument("--n2", type=int, default=600)
    p.add_argument("--root", type=Path, default=BENCH.parent)
    args = p.parse_args()
    root = args.root.resolve()
    a = worker_instructions(root, args.mode, args.n1)
    b = worker_instructions(root, args.mode, args.n2)
    print(json.dumps({"root": str(root), "mode": args.mode, "n1": args.n1, "n2": args.n2,
                      "instructions_n1": a, "instructions_n2": b,
                      "per_connection": round((b - a) / (args.n2 - args.n1))}))


if __name__ == "__main__":
    main()
