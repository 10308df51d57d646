"""What a soak must leave behind: nothing lost, no failed round, no connection or session
left, greenlets back to the start and memory back near the level after warm-up."""

from __future__ import annotations

from ..hardening_support import vitals
from ..support import wait_for
from . import Figures

#: RSS the server may keep above its post-warm-up level once everything is closed:
#: allocator arenas and caches do not go back to the OS, but a leak of even a few KiB
#: per round (thousands of rounds) would pass it.
RSS_SLACK = 24 * 1024 * 1024
#: running greenlets above the start allowed at the end (none expected)
GREENLET_SLACK = 0


def settle_and_check(base_url: str, figures: Figures, within: float = 30.0) -> list[str]:
    """Wait for the server to settle, record the final vitals, list what is wrong."""
    start = figures.baseline

    def settled() -> bool:
        figures.final = vitals(base_url)
        f = figures.final
        return (f["activeConnections"] == 0 and f["sessions"] == 0
                and f["greenletsRunning"] <= start["greenletsRunning"] + GREENLET_SLACK)

    try:
        wait_for(settled, within=within, what="the server to settle after the soak")
    except AssertionError:
        pass  # reported below with the numbers
    f = figures.final
    problems = []
    if figures.lost:
        problems.append(f"{figures.lost} replies lost")
    if figures.errors:
        problems.append(f"{len(figures.errors)} rounds failed, e.g. {figures.errors[0]}")
    if f["activeConnections"] or f["sessions"]:
        problems.append(f"left behind: {f['activeConnections']} connections, "
                        f"{f['sessions']} sessions")
    if f["greenletsRunning"] > start["greenletsRunning"] + GREENLET_SLACK:
        problems.append(f"greenlets {start['greenletsRunning']} -> {f['greenletsRunning']}")
    reference = figures.warm or start
    if f["rss"] > reference["rss"] + RSS_SLACK:
        problems.append(f"RSS {reference['rss']} after warm-up -> {f['rss']} at the end")
    return problems
