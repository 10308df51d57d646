"""Instructions per streamed event of bench/agui_events.py's server, counted by valgrind's
callgrind: an AG-UI TEXT_MESSAGE_CONTENT against a native MESSAGE_PART, repeatable to a
fraction of a percent whatever else the machine is doing (agui_events.py's CPU time moves
with the neighbours and is counted in 10 ms ticks).

    python bench/agui_instructions.py [--n1 1000] [--n2 3000] [--paths native_ws,agui_ws]

For each path (agui_events.py's: native, agui, native_ws, agui_ws) the server runs under
callgrind twice, streaming n1 and n2 events after a warm-up of 200 (one path a server
process); the difference of the two totals over n2 - n1 is the server's cost of one event,
start-up and imports cancelled out. Prints it per path and the AG-UI / native ratios. Needs
valgrind; takes about 35 s a path on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import agui_events  # noqa: E402  (bench/ is not a package)


def total(path: str, n: int) -> int:
    """callgrind's total for one server process that streams ``n`` events on ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             sys.executable, str(BENCH / "agui_events.py"), "--serve", "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=BENCH.parent, env={**os.environ, "PYTHONHASHSEED": "0"})
        assert proc.stdout is not None and proc.stdin is not None
        info = json.loads(proc.stdout.readline())
        run = agui_events.PATHS[path]
        run(info["port"], info["token"], 200, -1)
        got = run(info["port"], info["token"], n, 0)
        if got != n:
            raise SystemExit(f"{path}: {got} events of {n}")
        _, stderr = proc.communicate()  # EOF on stdin stops the server
    found = re.search(r"Collected : (\d+)", stderr)
    if found is None:
        raise SystemExit(f"no callgrind total for {path} x{n}:\n{stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n1", type=int, default=1000)
    ap.add_argument("--n2", type=int, default=3000)
    ap.add_argument("--paths", default="native_ws,agui_ws,native,agui")
    args = ap.parse_args()
    paths = args.paths.split(",")
    per_event: dict[str, float] = {}
    with ThreadPoolExecutor(2) as pool:  # the two sizes of a path side by side
        for path in paths:
            small, large = pool.map(total, (path, path), (args.n1, args.n2))
            per_event[path] = (large - small) / (args.n2 - args.n1)
            print(f"{path}: {per_event[path]:,.0f} instructions per event", flush=True)
    for native, agui in (("native", "agui"), ("native_ws", "agui_ws")):
        if native in per_event and agui in per_event:
            print(f"{agui} / {native}: {per_event[agui] / per_event[native]:.3f}")


if __name__ == "__main__":
    main()
