"""Cluster-wide statistics from each node's own report (docs/PROTOCOL.md §10's fields, summed where
they are counts and rates, weighted where they are averages)."""

from __future__ import annotations

from typing import Any

NODE_FIELDS = ("node", "host", "pid", "sessions", "connectedSessions", "totalConnections",
               "activeConnections", "totalMessages", "messagesPerSecond", "averageLatency",
               "errorRate", "uptime")


def aggregate_stats(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """``nodes[0]`` is this node; the result has the statistics fields for the whole cluster
    plus ``nodes``, each node's own figures."""
    total_messages = sum(n["totalMessages"] for n in nodes)
    rate = sum(n["messagesPerSecond"] for n in nodes)
    latency = (sum(n["averageLatency"] * n["messagesPerSecond"] for n in nodes) / rate
               if rate else 0.0)
    errors = sum(n.get("errorsSent", 0) for n in nodes)
    return {
        "totalConnections": sum(n["totalConnections"] for n in nodes),
        "activeConnections": sum(n["activeConnections"] for n in nodes),
        "totalMessages": total_messages,
        "messagesPerSecond": round(rate, 3),
        "averageLatency": round(latency, 4),
        "errorRate": round(min(1.0, errors / total_messages), 6) if total_messages else 0.0,
        "uptime": nodes[0]["uptime"],
        "nodes": [{k: n.get(k) for k in NODE_FIELDS} for n in nodes],
    }
