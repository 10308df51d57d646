"""/metrics: the server's counters in Prometheus' text format (docs/OPERATIONS.md).

Nothing here runs per message. The numbers are plain ints and dicts kept where things
happen (``stats.Stats``, the sessions' shared ``TrafficCounters``, the tool runners'
``stats.ToolCounters``); ``ProtoCollector`` turns them into metric families when a scraper
asks. Each ProtoServer has its own ``CollectorRegistry`` (``server.metrics_registry``),
so several servers in one process never collide and an application can register its
own collectors next to protoflask's. The collector is handed a way to reach the engine's
counters (``CounterSource``), never the server.
"""

from __future__ import annotations

from .clock import now_ms
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from flask import Response

    from .stats import Stats


def _labelled(metric: Any, counts: dict[Any, int]) -> Any:
    for key, value in sorted(counts.items()):
        metric.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return metric


class CounterSource(Protocol):
    """What the collector reads at scrape time: the engine's ``Stats`` and its hub's
    sessions."""

    @property
    def stats(self) -> "Stats": ...

    @property
    def hub(self) -> Any: ...


class ProtoCollector(Collector):
    """Reads one server's counters at scrape time (in the server's hub: no locking)."""

    def __init__(self, source: Callable[[], CounterSource]) -> None:
        self.source = source  # called at each scrape: init_app may rebuild the engine

    def collect(self) -> Iterator[Metric]:
        engine = self.source()
        stats = engine.stats
        traffic = stats.traffic
        p = "protoflask_"
        yield _labelled(GaugeMetricFamily(
            p + "connections_active", "Live transports now, by transport.",
            labels=["transport"]), stats.connections_active)
        yield _labelled(CounterMetricFamily(
            p + "connections_opened", "Live transports opened since start, by transport.",
            labels=["transport"]), stats.connections_opened)
        yield _labelled(CounterMetricFamily(
            p + "connections_refused", "Connection attempts refused, by error code.",
            labels=["code"]), stats.connections_refused)
        yield _labelled(CounterMetricFamily(
            p + "messages_received", "Upstream messages received, by type (unknown: a type "
            "no client may send; invalid: the envelope could not be read).",
            labels=["type"]), traffic.received)
        yield _labelled(CounterMetricFamily(
            p + "messages_sent", "Downstream messages sent (given a seq), by type; replays "
            "are not counted again.", labels=["type"]), traffic.sent)
        yield _labelled(CounterMetricFamily(
            p + "errors", "ERROR messages sent, by code.", labels=["code"]),
            stats.errors_by_code)
        yield CounterMetricFamily(
            p + "outbound_dropped", "Server messages dropped because a session's pending "
            "queue was full (OUTBOUND_QUEUE_FULL).", value=stats.outbound_dropped)
        yield _labelled(CounterMetricFamily(
            p + "tool_calls", "Tool executions ended, by tool and status (completed, error, "
            "cancelled).", labels=["tool", "status"]), stats.tools.calls)
        durations = HistogramMetricFamily(
            p + "tool_duration_seconds", "Time from a tool's execute being called to its end.",
            labels=["tool"])
        for tool, histogram in sorted(stats.tools.durations.items()):
            durations.add_metric([tool], histogram.cumulative(), histogram.sum)
        yield durations
        yield _labelled(CounterMetricFamily(
            p + "runs", "Run transitions, by outcome (started, finished, cancelled, error).",
            labels=["outcome"]), stats.runs)
        yield _labelled(CounterMetricFamily(
            p + "replays", "Replays of missed messages by source (resume: a reconnect with "
            "last_seq; request: REPLAY_REQUEST) and result (complete, or unavailable: "
            "REPLAY_UNAVAILABLE).", labels=["source", "result"]), traffic.replays)
        yield CounterMetricFamily(
            p + "replayed_messages", "Messages resent by replays.",
            value=traffic.replayed_messages)

        g = session_gauges(engine)
        sessions = GaugeMetricFamily(p + "sessions", "Sessions held, by state (disconnected "
                                     "ones are kept for resume).", labels=["state"])
        sessions.add_metric(["connected"], g["connected"])
        sessions.add_metric(["disconnected"], g["disconnected"])
        yield sessions
        yield GaugeMetricFamily(p + "runs_active", "Active runs in all sessions.",
                                value=g["runs"])
        yield GaugeMetricFamily(
            p + "pending_outbound_messages", "Server messages waiting in sessions' pending "
            "queues (for credit, a RESUME_CHANNEL or the transport).", value=g["pending"])
        yield GaugeMetricFamily(
            p + "outbound_bytes", "Unsent downstream bytes, queued or being written.",
            value=g["outboundBytes"])
        yield GaugeMetricFamily(
            p + "tool_queue_depth", "Tool calls waiting for a free slot (maxConcurrentRuns).",
            value=g["toolsQueued"])
        yield GaugeMetricFamily(p + "tools_running", "Tool executions running now.",
                                value=g["toolsRunning"])

        snapshot = stats.snapshot(now_ms())
        yield GaugeMetricFamily(p + "uptime_seconds", "Seconds since the server started.",
                                value=snapshot["uptime"] / 1000.0)
        yield GaugeMetricFamily(
            p + "messages_per_second", "Upstream messages per second over the last 10 s "
            "(/stats messagesPerSecond).", value=snapshot["messagesPerSecond"])
        yield GaugeMetricFamily(
            p + "average_latency_seconds", "Mean time from receiving an upstream message to "
            "finishing its handling, over the last 10 s (/stats averageLatency).",
            value=snapshot["averageLatency"] / 1000.0)


def session_gauges(source: CounterSource) -> dict[str, int]:
    """The sessions' gauges for /metrics and the dashboard, without visiting a session:
    the counts by state and the tool calls running and queued are exact running counts
    (``TrafficCounters.attached``, kept as sessions change state, with the hub's size;
    ``ToolCounters.running``/``queued``, kept by the runners); the runs, pending
    messages and unsent bytes the sessions hold are the sum the last heartbeat tick took
    (at most a second old): they change with every message."""
    connected = source.stats.traffic.attached
    tools = source.stats.tools
    return {"connected": connected, "disconnected": len(source.hub) - connected,
            "toolsRunning": tools.running, "toolsQueued": tools.queued, **source.stats.held}


def create_registry(source: Callable[[], CounterSource]) -> CollectorRegistry:
    """A registry with protoflask's collector, reading the engine ``source`` returns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProtoCollector(source))
    return registry


def metrics_response(registry: CollectorRegistry, accept: str | None) -> "Response":
    """The exposition format the scraper asked for (text, or OpenMetrics)."""
    from flask import Response

    encoder, content_type = choose_encoder(accept or "")
    return Response(encoder(registry), status=200, headers={"Content-Type": content_type})
