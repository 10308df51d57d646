"""Instructions per in-process TOOL_CALL (built-in echo) -> TOOL_DONE, counted by
valgrind's callgrind, for this checkout or another (``--root``, e.g. a ``git archive`` of
the commit before a change): repeatable to a fraction of a percent on a busy machine,
where bench/micro_tool.py's CPU time moves by 10-20%.

    python bench/tool_instructions.py [--root DIR ...] [--n1 300] [--n2 900] [--kind tool|ping]

Each root's own bench/micro_tool.py (its ``make_server`` and ``run_once``: every checkout
since the port has them) runs one connection fed n1, then n2 calls, under callgrind; the
difference of the totals over n2 - n1 is one call's cost (start-up, imports and the
frames' making outside the loop cancelled out). ``--kind ping``: the PING -> PONG beside
it. The roots run one after the other (one core). Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: run in the child: the root's own micro_tool, one warm-up of 50, then n of ``kind``
CHILD = """
import sys
root, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, root + "/bench")
import micro_tool
server = micro_tool.make_server(None)
micro_tool.run_once(server, 50, kind)
micro_tool.run_once(server, n, kind)
"""


def total(root: Path, n: int, kind: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
             "-c", CHILD, str(root), str(n), kind],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode or found is None:
            raise SystemExit(f"no callgrind total for {root} x{n}:\n{run.stderr[-2000:]}")
        return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", action="append", type=Path,
                    help="a checkout to count (repeatable; default: this one)")
    ap.add_argument("--n1", type=int, default=300)
    ap.add_argument("--n2", type=int, default=900)
    ap.add_argument("--kind", choices=("tool", "ping"), default="tool")
    args = ap.parse_args()
    for root in args.root or [ROOT]:
        root = root.resolve()
        per = (total(root, args.n2, args.kind) - total(root, args.n1, args.kind)) / (
            args.n2 - args.n1)
        print(f"{root} {args.kind}: {per:,.0f} instructions per call")


if __name__ == "__main__":
    main()
