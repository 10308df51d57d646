"""bench/run.py as a smoke test: a few seconds of PING load must produce numbers.

Never a timing assertion: the numbers only have to exist and be positive. Pinning to
CPUs is skipped by the bench itself on a single-CPU machine; the load generator falls
back from the C one (needs a compiler) to Node.js to the Python one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_quick_ping_bench_produces_numbers(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "ping",
           "--servers", "protoflask,flask-sock", "--levels", "1,10", "--warmup", "0.3",
           "--seconds", "1", "--no-progress", "--no-gate", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: run.py stops the servers it started
        out, err = proc.communicate(timeout=15)
        pytest.fail(f"bench did not finish:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "PING -> PONG" in out

    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, files
    data = json.loads(files[0].read_text())
    assert "error" not in data, data.get("error")
    for server in ("protoflask", "flask-sock"):
        for level in ("1", "10"):
            cell = data["ping"][server][level]
            assert cell["connected"] == int(level), cell
            assert cell["rt_per_s"] > 0, cell
            assert cell["p50_ms"] > 0 and cell["p99_ms"] >= cell["p50_ms"], cell
            assert cell["errors"] == 0, cell
    assert any(t["target"].startswith("PING->PONG rt/s") for t in data["targets"])


@pytest.mark.timeout(120)
def test_quick_http_bench_produces_numbers(tmp_path: Path) -> None:
    """The downstream rows (WebSocket, SSE, stream, duplex stream) and gunicorn's POST floor
    beside them."""
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "http",
           "--servers", "protoflask", "--warmup", "0.3", "--seconds", "1", "--no-progress",
           "--no-gate", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "floor: bare gunicorn POST" in proc.stdout

    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    http = data["http_transports"]
    assert http["status"] == "measured" and not http["failures"], http
    rows = {r["transport"]: r for r in http["results"]}
    assert set(rows) >= {"sse", "stream", "duplex", "floor"}, rows
    for name, row in rows.items():
        assert row["messages_per_s"] > 0 and row["errors"] == 0, (name, row)
    assert rows["floor"]["server_us_per_op"] > 0, rows["floor"]


def _saved_run(tmp_path: Path, protoflask_rt_per_s: float) -> Path:
    """A saved run (the fields --render reads) whose PING row is ``protoflask_rt_per_s``
    against flask-sock's 1000."""
    cell = {"p50_ms": 0.5, "p99_ms": 1.0, "connected": 10}
    saved = {"started": "2026-01-01T00:00:00", "machine": {"cpus": 2},
             "pinning": {"server_cpu": 0, "generator_cpu": 1}, "generator": "python",
             "settings": {"warmup": 0.3, "seconds": 1, "rounds": 1}, "frame_bytes": 100,
             "ping": {"protoflask": {"10": {**cell, "rt_per_s": protoflask_rt_per_s}},
                      "flask-sock": {"10": {**cell, "rt_per_s": 1000}}}}
    path = tmp_path / f"run-{protoflask_rt_per_s}.json"
    path.write_text(json.dumps(saved))
    return path


def test_a_failing_target_row_fails_the_exit_code(tmp_path: Path) -> None:
    def render(path: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--render",
                               str(path), *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)

    slow = render(_saved_run(tmp_path, 500))  # 50% of flask-sock: the >= 70% row FAILs
    assert "FAIL" in slow.stdout
    assert slow.returncode == 3, slow.stderr
    assert "bench: 1 target(s) FAIL: PING->PONG rt/s @10" in slow.stderr
    assert render(_saved_run(tmp_path, 500), "--no-gate").returncode == 0
    fast = render(_saved_run(tmp_path, 900))
    assert fast.returncode == 0 and "FAIL" not in fast.stdout, fast.stdout + fast.stderr


#: a saved three-round run's head, for the rows against before rendered from it
_ROUNDS_RUN: dict[str, Any] = {
    "started": "2026-01-01T00:00:00", "machine": {"cpus": 2},
    "pinning": {"server_cpu": 0, "generator_cpu": 1}, "generator": "c",
    "settings": {"warmup": 0.3, "seconds": 1, "rounds": 3}, "frame_bytes": 100}


def _before_rows(tmp_path: Path, saved: dict[str, Any]) -> dict[str, str]:
    """The "x before" target rows of ``saved`` as bench/run.py --render prints them, by
    their name up to the first comma."""
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps(saved))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--render",
                           str(path), "--no-gate"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {line.split(",")[0]: line for line in proc.stdout.splitlines() if "x before" in line}


def test_the_tool_row_against_before_is_the_median_of_each_rounds_pair(tmp_path: Path) -> None:
    """Issue 28's row: with --before and --rounds, each round's after/before pair gives a
    ratio and the row is their median, so that a slow round (the machine, not the code)
    that hit one server's cell does not decide it. Here the per-server medians (110 and
    100: 1.10x) would fail the row; the pairs (1.04, 1.02, 1.20) pass it at 1.04x."""
    cell = {"p50_ms": 0.5, "p99_ms": 1.0, "connections": 10}
    after = [{**cell, "server_us_per_op": us} for us in (104.0, 110.0, 120.0)]
    before = [{**cell, "server_us_per_op": us} for us in (100.0, 108.0, 100.0)]
    saved = {**_ROUNDS_RUN, "tool_rounds": {"protoflask": after, "protoflask-before": before},
             "tool": {"protoflask": after[1], "protoflask-before": before[1]}}
    (row,) = _before_rows(tmp_path, saved).values()
    assert "1.040x (3 rounds: 1.02-1.20)" in row and "PASS" in row, row

    saved["tool_rounds"]["protoflask"] = [{**cell, "server_us_per_op": us}
                                          for us in (110.0, 118.0, 120.0)]
    (row,) = _before_rows(tmp_path, saved).values()
    assert "1.100x (3 rounds: 1.09-1.20)" in row and "FAIL" in row, row


def test_the_ping_rows_against_before_are_the_median_of_each_rounds_pair(
        tmp_path: Path) -> None:
    """The same for PING, one row per level: at 10 the per-server medians (105 and 100:
    1.05x, a pass) hide that two of three rounds' pairs are 1.10 and 1.20, and the row
    FAILs at 1.10x; at 100 the medians (110 and 100) would fail, the pairs pass at 1.00x."""
    def cells(*us: float) -> list[dict[str, Any]]:
        return [{"server_us_per_op": u, "rt_per_s": 1e6 / u} for u in us]

    rows = _before_rows(tmp_path, {
        **_ROUNDS_RUN,
        "ping_rounds": {"protoflask": {"10": cells(100.0, 105.0, 132.0),
                                       "100": cells(100.0, 110.0, 130.0)},
                        "protoflask-before": {"10": cells(100.0, 95.4, 110.0),
                                              "100": cells(100.0, 80.0, 130.0)}}})
    at10, at100 = rows["PING->PONG server µs/reply @10"], rows["PING->PONG server µs/reply @100"]
    assert "1.101x (3 rounds: 1.00-1.20)" in at10 and "FAIL" in at10, at10
    assert "1.000x (3 rounds: 1.00-1.38)" in at100 and "PASS" in at100, at100
    assert not any("tool call" in row for row in rows.values())  # no tool cells, no tool row


@pytest.mark.timeout(180)
def test_quick_storm_bench_produces_numbers(tmp_path: Path) -> None:
    """The reconnect storm rows (issue 29) at a tiny N: every row connects all its
    sessions, the resumes replay each message exactly once (on Redis too), and the ratio
    rows exist. Never how large the numbers are."""
    n = 30
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "storm",
           "--storm", str(n), "--storm-heartbeat-ms", "500", "--no-progress", "--no-gate",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Reconnect storms" in proc.stdout

    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert "error" not in data, data.get("error")
    (rnd,) = data["storm"]["rounds"]
    assert set(rnd) == {"echo", "ws", "sse", "stream", "resume", "resume-redis", "memory"}, rnd
    for row, r in rnd.items():
        assert r["connected"] == n and r["failed"] == 0, (row, r)
        assert r["connect_per_s"] > 0 and r["still_open"] == n, (row, r)
    held = rnd["memory"]
    assert held["heartbeats_answered"] >= n, held  # held through a heartbeat round
    assert held["kb_per_conn_held"] is not None and rnd["echo"]["kb_per_conn"] is not None
    for row in ("resume", "resume-redis"):
        r = rnd[row]
        assert r["resumed"] == n and r["replayed_exactly_once"] == n, (row, r)
        assert r["replay_duplicates"] == 0 and r["replay_missing"] == 0, (row, r)
    rows = [t["target"] for t in data["targets"] if t["target"].startswith("[29]")]
    assert len(rows) == 6, rows
