"""Instructions per connection in a real gunicorn worker over one reconnect storm,
counted by valgrind's callgrind (issue 29).

    python bench/storm_instructions.py [--root CHECKOUT] [--n 1000] [--mode ws]

Starts ``gunicorn -c gunicorn.conf.py wsgi:app`` from ``--root`` (default: this checkout)
under callgrind with instrumentation off (the worker is followed across gunicorn's fork),
warms it with a storm of 100 (bench/storm.py), switches instrumentation on in the worker
(``callgrind_control -i on``) for one storm of ``--n`` handshakes in ``--mode`` (ws, sse,
stream, resume), off again, stops it and divides the worker's total by ``--n``. The
server's CPU per connection in bench/run.py's storm rows moves by 30% with the machine's
other work; this count repeats to ~2% (the heartbeat tick and GC timing vary). User space
only: the kernel's share of the syscalls is not counted (strace -c the worker for those).
gunicorn's optional C request parser is not used (``--http-parser python``), as in
bench/worker_instructions.py.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SECRET = "bench-secret-bench-secret-bench-secret!!"


def storm(port: int, mode: str, n: int) -> dict:
    """One bench/storm.py run, its connections closed once it reported."""
    cfg = {"baseUrl": f"http://127.0.0.1:{port}", "mode": mode, "connections": n,
           "proto": "proto", "inflight": 100, "secret": SECRET, "serverPid": 0,
           "replay": 10, "timeout": 900}
    proc = subprocess.Popen([sys.executable, str(BENCH / "storm.py"), json.dumps(cfg)],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=BENCH)
    assert proc.stdout is not None and proc.stdin is not None
    ready = json.loads(proc.stdout.readline())
    proc.stdin.write("close\n")
    proc.stdin.flush()
    proc.communicate(timeout=300)
    return ready


def count(root: Path, n: int, mode: str) -> tuple[float, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="protoflask-storm-cg-")
    env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
           "ENABLE_COMPRESSION": "false", "ECHO_MESSAGES": "false", "RATE_LIMIT": "0",
           "MAX_CONNECTIONS": str(2 * n + 1000), "MAX_CONNECTIONS_PER_USER": str(2 * n + 1000),
           "WEB_CONCURRENCY": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", "--instr-atstart=no",
         f"--callgrind-out-file={out}/cg.%p", sys.executable, "-m", "gunicorn",
         "-c", "gunicorn.conf.py", "--timeout", "900", "--http-parser", "python",
         "--bind", f"127.0.0.1:{port}", "wsgi:app"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}/log", "w"),
        start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"gunicorn under callgrind did not start: see {out}/log") \
                        from None
                time.sleep(1)
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                              text=True).stdout.split()
        worker = kids[0] if kids else str(proc.pid)
        storm(port, "ws", 100)  # first-use imports and caches out of the count
        subprocess.run(["callgrind_control", "-i", "on", worker], capture_output=True)
        done = storm(port, mode, n)["connected"]
        subprocess.run(["callgrind_control", "-i", "off", worker], capture_output=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(300)
    totals = []
    for path in glob.glob(f"{out}/cg.*"):
        found = re.search(r"^totals: (\d+)", Path(path).read_text(), re.M)
        if found:
            totals.append(int(found.group(1)))
    return max(totals) / n, done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(BENCH.parent))
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--mode", default="ws", choices=["ws", "sse", "stream", "resume"])
    args = p.parse_args()
    per, done = count(Path(args.root).resolve(), args.n, args.mode)
    print(f"{args.root}: {args.mode} x{args.n}: {per:,.0f} instructions per connection "
          f"in the worker ({done} done)")


if __name__ == "__main__":
    main()
