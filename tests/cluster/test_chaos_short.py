"""bench/cluster_chaos.py --short: two gunicorn nodes behind nginx round robin, sessions
on all three transports through protoflask.client (texts, add, echo, PINGs, and the
application's 2-10 s ``work`` tool with its TOOL_UPDATEs), and four faults (kill -9 a node,
FLUSHALL, Redis unreachable 10 s and back with its data, Redis restarted empty); the
checker compares every frame's content per seq. Nothing may be lost, reused, duplicated
or stranded, no session may die, and every session must serve again after each fault.
Never a timing assertion: "serving again" only has to happen (within a minute)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..interop.conftest import need_program

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_the_short_chaos_soak_breaks_no_invariant() -> None:
    need_program("nginx", "nginx")
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "cluster_chaos.py"),
                             "--short", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=130)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the soak stops what it started
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"the soak did not finish:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-4000:]
    rows = json.loads(out.strip().splitlines()[-1])
    assert [r["fault"] for r in rows] == ["kill9", "flushall", "outage10", "restart"]
    for row in rows:
        assert all(row[k] == 0 for k in ("lost", "reused", "duplicates", "stranded",
                                          "done_twice", "dead")), row
        assert row["calls"] > 0 and row["serving_s"] is not None, row
