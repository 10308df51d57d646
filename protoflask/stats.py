"""The server-side counters, kept where things happen and read by /stats, /metrics and the
dashboard: connections, messages and latency (``Stats``), and tool executions
(``ToolCounters``). Plain ints and dicts: nothing here goes through a metrics library on
the per-message path. (What one session's core counts, its traffic, is
``core.traffic``; ``Stats.traffic`` is the instance every session of this node shares.)
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any

from .clock import now_ms
from .core.traffic import TrafficCounters

if TYPE_CHECKING:
    from .tools import ToolExecution

STATS_WINDOW_MS = 10_000
HISTORY_SECONDS = 300  # per-second samples the dashboard charts (five minutes)

#: no bucket yet (its second matches no clock reading): ``Stats.record`` opens one
_NO_BUCKET: list[float] = [-1.0, 0, 0.0]

#: upper bounds (seconds) of the tool duration histogram's buckets
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0)


class DurationHistogram:
    """Bucket counts, sum and count, as a Prometheus histogram needs them."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(TOOL_BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(TOOL_BUCKETS, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip((*map(str, TOOL_BUCKETS), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class ToolCounters:
    """Tool executions by tool: how they ended, and how long those that ran took
    (from ``execute`` being called to the end: queue time excluded)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], int] = {}  # (tool, status) -> count
        self.durations: dict[str, DurationHistogram] = {}
        self.running = 0  # tool calls executing now, over every session's runner
        self.queued = 0  # waiting for a free slot (kept by the runners: ToolTally)

    def finished(self, execution: "ToolExecution") -> None:
        key = (execution.tool_name, execution.status)
        self.calls[key] = self.calls.get(key, 0) + 1
        if execution.run_started is not None:
            histogram = self.durations.get(execution.tool_name)
            if histogram is None:
                histogram = self.durations[execution.tool_name] = DurationHistogram()
            histogram.observe(time.perf_counter() - execution.run_started)


#: what the sessions hold, summed by the heartbeat tick's walk over them (``add_held``)
HELD = ("runs", "pending", "outboundBytes")


def held_of(sessions: list[Any]) -> dict[str, int]:
    """What the sessions (``hub.LiveSession``s: a layer above) hold: the gauges /metrics
    and the dashboard read, summed by the heartbeat tick's walk (one pass, plain sums:
    it runs over every session each tick)."""
    runs = pending = unsent = 0
    for live in sessions:
        core = live.core
        outbound = core.outbound
        runs += len(core.runs)  # (no registry made for a session without one)
        pending += len(outbound.pending)
        unsent += outbound.unsent_bytes
    return {"runs": runs, "pending": pending, "outboundBytes": unsent}


class Stats:
    """The counters of docs/PROTOCOL.md §10 Statistics, plus the plain counters /metrics
    and the dashboard read (docs/OPERATIONS.md): bumped where things happen, never
    through a metrics library on the per-message path."""

    def __init__(self, now: int) -> None:
        self.started_at = now
        self.total_connections = 0
        self.active_connections = 0
        self.total_messages = 0
        self.errors_sent = 0
        # [second, messages, latency sum ms] for the last 10 s (one latency per message)
        self._buckets: deque[list[float]] = deque()
        self._bucket: list[float] = _NO_BUCKET  # the newest of them, which record() fills
        self.traffic = TrafficCounters()  # shared by every session's core
        self.connections_active: dict[str, int] = {}  # by transport kind
        self.connections_opened: dict[str, int] = {}
        self.connections_refused: dict[str, int] = {}  # by error code
        self.errors_by_code: dict[str, int] = {}  # ERROR messages sent
        self.outbound_dropped = 0  # OUTBOUND_QUEUE_FULL
        self.runs: dict[str, int] = dict.fromkeys(
            ("started", "finished", "cancelled", "error"), 0)
        self.tools = ToolCounters()
        #: what the sessions hold, summed at the last heartbeat tick (``add_held``)
        self.held: dict[str, int] = dict.fromkeys(HELD, 0)
        #: [second start ms, most connections open in it, messages, mean latency ms, errors]
        self.history: deque[list[float]] = deque(maxlen=HISTORY_SECONDS)
        self._sampled_second = now // 1000
        self._errors_at_sample = 0
        self._peak_connections = 0  # since the last sample

    def connection_opened(self, kind: str) -> None:
        self.active_connections += 1
        self.total_connections += 1
        self._peak_connections = max(self._peak_connections, self.active_connections)
        self.connections_active[kind] = self.connections_active.get(kind, 0) + 1
        self.connections_opened[kind] = self.connections_opened.get(kind, 0) + 1

    def connection_closed(self, kind: str) -> None:
        self.active_connections -= 1
        self.connections_active[kind] = self.connections_active.get(kind, 0) - 1

    def count(self, counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def sample(self, now: int) -> None:
        """Once a second (the heartbeat ticker calls it): append the seconds completed
        since the last sample to ``history``, from the 10 s buckets."""
        second = now // 1000
        if second <= self._sampled_second:
            return
        by_second = {int(b[0]): b for b in self._buckets}
        errors = self.errors_sent - self._errors_at_sample
        self._errors_at_sample = self.errors_sent
        peak = max(self._peak_connections, self.active_connections)
        self._peak_connections = self.active_connections
        first = max(self._sampled_second, second - HISTORY_SECONDS)
        for s in range(first, second):
            b = by_second.get(s)
            self.history.append([s * 1000, peak, b[1] if b else 0,
                                 round(b[2] / b[1], 4) if b and b[1] else 0.0,
                                 errors if s == second - 1 else 0])
        self._sampled_second = second

    def record(self, now: int, latency_ms: float) -> None:
        """One message handled at ``now`` (ms) in ``latency_ms``."""
        self.total_messages += 1
        bucket = self._bucket
        if bucket[0] != now // 1000:
            bucket = self._open_bucket(now)
        bucket[1] += 1
        bucket[2] += latency_ms

    def _open_bucket(self, now: int) -> list[float]:
        bucket = self._bucket = [now // 1000, 0, 0.0]
        self._buckets.append(bucket)
        self._trim(now)
        return bucket

    def _trim(self, now: int) -> None:
        horizon = (now - STATS_WINDOW_MS) // 1000
        buckets = self._buckets
        while buckets and buckets[0][0] <= horizon:
            buckets.popleft()
        if not buckets:  # the newest went too: the next record opens a new one
            self._bucket = _NO_BUCKET

    def figures(self) -> dict[str, Any]:
        """This node's statistics (docs/PROTOCOL.md §10) now, and ``errorsSent``: what a
        cluster's beat reports (``SessionHost.local_stats``: a call down to here, not up
        into the engine)."""
        return {**self.snapshot(now_ms()), "errorsSent": self.errors_sent}

    def snapshot(self, now: int) -> dict[str, Any]:
        self._trim(now)
        uptime = max(1, now - self.started_at)
        window_s = min(STATS_WINDOW_MS, uptime) / 1000.0
        recent = sum(b[1] for b in self._buckets)
        return {
            "totalConnections": self.total_connections,
            "activeConnections": self.active_connections,
            "totalMessages": self.total_messages,
            "messagesPerSecond": round(recent / window_s, 3),
            "averageLatency": round(sum(b[2] for b in self._buckets) / recent, 4)
            if recent else 0.0,
            "errorRate": round(min(1.0, self.errors_sent / self.total_messages), 6)
            if self.total_messages else 0.0,
            "uptime": uptime,
        }
