"""Instructions per in-process PING -> PONG, counted by valgrind's callgrind: repeatable
to a fraction of a percent whatever else the machine is doing (bench/micro_ping.py's CPU
time moves with the neighbours).

    python bench/instructions.py [--redis URL] [--n1 1000] [--n2 3000]

Runs ``bench/micro_ping.py --only protoflask`` (and ``--only echo``) under callgrind with
n1 and with n2 messages; the difference of the two totals over n2 - n1 is the cost of one
message, start-up and imports cancelled out. It includes micro_ping's own making of the
frames (about 3k instructions a message, the same for both sides). Needs valgrind.
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


def total(side: str, n: int, redis: str | None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=*",
               f"--callgrind-out-file={tmp}/out", sys.executable, str(BENCH / "micro_ping.py"),
               "--only", side, "--n", str(n)]
        if redis:
            cmd += ["--redis", redis]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no callgrind total for {side} x{n}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", default=None, help="a Redis URL: the cluster hub")
    ap.add_argument("--n1", type=int, default=1000)
    ap.add_argument("--n2", type=int, default=3000)
    args = ap.parse_args()
    for side in ("echo", "protoflask"):
        per = (total(side, args.n2, args.redis) - total(side, args.n1, args.redis)) \
            / (args.n2 - args.n1)
        label = side + (" on Redis" if side == "protoflask" and args.redis else "")
        print(f"{label}: {per:,.0f} instructions per message")


if __name__ == "__main__":
    main()
