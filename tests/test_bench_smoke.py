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

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_quick_ping_bench_produces_numbers(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "ping",
           "--servers", "protoflask,flask-sock", "--levels", "1,10", "--warmup", "0.3",
           "--seconds", "1", "--no-progress", "--out", str(tmp_path)]
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
           "--out", str(tmp_path)]
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
