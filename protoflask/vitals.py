"""What a soak or fuzz test needs to see inside a running server process: its memory, its
greenlets and its sessions. Served at GET /debug/vitals only when ``debugVitals`` is on
(env PROTOFLASK_DEBUG_VITALS=1): walking every object is slow, and none of this is for
the public."""

from __future__ import annotations

import gc
import resource
from typing import TYPE_CHECKING, Any

from greenlet import greenlet

from .clock import now_ms

if TYPE_CHECKING:
    from .engine import Engine


def rss_bytes() -> int:
    """Resident set size now (Linux /proc), else the peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def greenlets() -> tuple[int, int]:
    """(greenlets alive, of which not finished), after a full collection: gevent's
    Greenlets and raw ones (a WebSocket connection's reader is one: web.serve_apart).
    Objects frozen by gc.freeze() at start-up are not seen: compare counts, not totals."""
    gc.collect()
    found = [o for o in gc.get_objects() if isinstance(o, greenlet)]
    return len(found), sum(1 for g in found if not g.dead)


def snapshot(engine: "Engine") -> dict[str, Any]:
    """The vitals. Sessions and tool calls are the running counts /metrics reads (no walk
    of the sessions: as cheap with 10,000 of them as with 10); the object walk for the
    greenlets is this debug endpoint's own cost."""
    total, running = greenlets()
    stats = engine.stats.snapshot(now_ms())
    connected = engine.stats.traffic.attached
    budget = engine.budget
    return {
        "rss": rss_bytes(),
        "peakRss": peak_rss_bytes(),
        "greenlets": total,
        "greenletsRunning": running,
        "sessions": len(engine.hub),
        "connectedSessions": connected,
        "runningTools": engine.stats.tools.running,
        "queuedTools": engine.stats.tools.queued,
        "activeConnections": stats["activeConnections"],
        "totalConnections": stats["totalConnections"],
        "totalMessages": stats["totalMessages"],
        "errorsSent": engine.stats.errors_sent,
        # the memory budget's running counts (budget.py): all sessions, and by user
        "heldBytes": budget.total,
        "heldByUser": {user: a.held + a.window for user, a in budget.accounts.items()},
    }
