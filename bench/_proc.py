"""Reading another process's CPU time, for the generators' server µs/reply."""

from __future__ import annotations


def server_cpu(pid: int, clk_tck: int) -> float | None:
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / clk_tck
    except OSError:
        return None
