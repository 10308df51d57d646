"""Instructions per in-process PING -> PONG, counted by valgrind's callgrind: repeatable
to a fraction of a percent whatever else the machine is doing (bench/micro_ping.py's CPU
time moves with the neighbours).

    python bench/instructions.py [--redis URL] [--n1 1000] [--n2 3000] [--toggle]

Runs ``bench/micro_ping.py --only protoflask`` (and ``--only echo``) under callgrind with
n1 and with n2 messages; the difference of the two totals over n2 - n1 is the cost of one
message, start-up and imports cancelled out. It includes micro_ping's own making of the
frames (the same for both sides). Needs valgrind.

Every instruction is counted. Until p5-ping this ran callgrind with
``--toggle-collect=*``, which flips collection on at every function entry and off at the
next: it counted only the functions at every other depth of the C stack, which left out
the interpreter loop's own instructions (a third of the total) and moved with the call
structure rather than with the work. ``--toggle`` gives that figure again, to compare
with the records made with it (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def totals(side: str, sizes: tuple[int, ...], redis: str | None, toggle: bool) -> list[int]:
    """The callgrind totals of ``side`` with each number of messages (run side by side)."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for n in sizes:
            cmd = ["valgrind", "--tool=callgrind", *(["--toggle-collect=*"] if toggle else []),
                   f"--callgrind-out-file={tmp}/out.{n}", sys.executable,
                   str(BENCH / "micro_ping.py"), "--only", side, "--n", str(n)]
            if redis:
                cmd += ["--redis", redis]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            runs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, env=env))
        out = []
        for n, run in zip(sizes, runs, strict=True):
            _, stderr = run.communicate()
            found = re.search(r"Collected : (\d+)", stderr)
            if run.returncode or found is None:
                raise SystemExit(f"no callgrind total for {side} x{n}:\n{stderr[-2000:]}")
            out.append(int(found.group(1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", default=None, help="a Redis URL: the cluster hub")
    ap.add_argument("--n1", type=int, default=1000)
    ap.add_argument("--n2", type=int, default=3000)
    ap.add_argument("--toggle", action="store_true",
                    help="count as before p5-ping (--toggle-collect=*: every other call depth)")
    args = ap.parse_args()
    for side in ("echo", "protoflask"):
        small, large = totals(side, (args.n1, args.n2), args.redis, args.toggle)
        per = (large - small) / (args.n2 - args.n1)
        label = side + (" on Redis" if side == "protoflask" and args.redis else "")
        print(f"{label}: {per:,.0f} instructions per message")


if __name__ == "__main__":
    main()
