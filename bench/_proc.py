"""What the Python load generators share: the measured window and the CPU it cost.

Both run under gevent (they monkey-patch before importing this)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import gevent


class Window(NamedTuple):
    seconds: float
    gen_cpu_s: float
    server_cpu_s: float | None  # None when the server's pid is unknown or gone


def server_cpu(pid: int, clk_tck: int) -> float | None:
    """utime + stime of another process, in seconds."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / clk_tck
    except OSError:
        return None


def measure(cfg: dict[str, Any], state: dict[str, Any]) -> Window:
    """Warm up, then count for cfg["seconds"] (workers count while state["counting"]);
    stops the workers (state["running"] = False) at the end."""
    gevent.sleep(cfg["warmup"])
    state["counting"] = True
    w0, cpu0 = time.perf_counter(), time.process_time()
    srv0 = server_cpu(cfg["serverPid"], cfg["clkTck"])
    gevent.sleep(cfg["seconds"])
    state["counting"] = False
    seconds = time.perf_counter() - w0
    cpu = time.process_time() - cpu0
    srv1 = server_cpu(cfg["serverPid"], cfg["clkTck"])
    state["running"] = False
    return Window(seconds, cpu, None if srv0 is None or srv1 is None else srv1 - srv0)


def percentile_ms(sorted_seconds: list[float], q: float) -> float | None:
    if not sorted_seconds:
        return None
    return round(sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))]
                 * 1000, 3)
