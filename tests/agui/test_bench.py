"""bench/agui_events.py as a smoke test: it must produce both figures and their ratio
(never a timing assertion: the numbers only have to exist)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.timeout(120)
def test_agui_bench_produces_a_ratio(tmp_path: Path) -> None:
    out = tmp_path / "agui.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agui_events.py"),
                           "--events", "2000", "--repeat", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["events"] == 2000
    assert result["native_us_per_event"] >= 0 and result["agui_us_per_event"] >= 0
    assert result["native_ws_us_per_event"] >= 0 and result["agui_ws_us_per_event"] >= 0
    assert "ratio" in result and "ws_ratio" in result and result["target_ratio"] == 1.5
