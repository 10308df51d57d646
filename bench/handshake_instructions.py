"""Instructions of one in-process handshake, the Python-level work alone (issue 29).

    python bench/handshake_instructions.py [--n1 1000] [--n2 3000] [--root DIR] [--gc]

Runs bench/session_objects.py's handshake (``Ports.admit``, ``port``, ``attach``, a HELLO
through the port, its reply taken) ``n1`` and then ``n2`` times in a fresh process under
valgrind's callgrind; the difference over ``n2 - n1`` is one handshake's instructions.
The garbage collector is off unless ``--gc``: in process the heap grows with the
sessions, so when a full collection falls inside the counted window moves the count by
more than the work does (the young collections' share is steered by the objects a
session keeps: bench/session_objects.py). No sockets, no transport: what the engine,
the port and the core do (bench/storm_instructions.py counts a real worker's).
``--root``: another checkout (``git archive main | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _callgrind import totals

BENCH = Path(__file__).resolve().parent

CHILD = """
import gc, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
sys.argv = sys.argv[:1] + sys.argv[2:]
import session_objects as so
if not int(sys.argv[2]):
    gc.disable()
engine, ports = so.engine()
tokens = [so.token(f"u{i}") for i in range(int(sys.argv[1]))]
kept = []
for t in tokens:
    so.handshake(ports, t, kept)
"""


def count(root: Path, n: int, with_gc: bool) -> int:
    out = tempfile.mkdtemp(prefix="protoflask-hs-cg-")
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg",
                    sys.executable, "-c", CHILD, str(root), str(n), str(int(with_gc))],
                   env=env, check=True, capture_output=True)
    return sum(totals(f"{out}/cg"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n1", type=int, default=1000)
    p.add_argument("--n2", type=int, default=3000)
    p.add_argument("--root", type=Path, default=BENCH.parent)
    p.add_argument("--gc", action="store_true", help="leave the garbage collector on")
    args = p.parse_args()
    root = args.root.resolve()
    a, b = count(root, args.n1, args.gc), count(root, args.n2, args.gc)
    print(f"{root}: {round((b - a) / (args.n2 - args.n1)):,} instructions per handshake"
          f" (gc {'on' if args.gc else 'off'})")


if __name__ == "__main__":
    main()
