"""Reading the cluster: statistics for the whole cluster from each node's own report
(docs/PROTOCOL.md §10's fields, summed where they are counts and rates, weighted where
they are averages), and the sessions other nodes hold, as /stats and the dashboard show
them."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, cast

import orjson

from .journal import decode_state
from .keys import Keys
from .redis_client import UNAVAILABLE, text

if TYPE_CHECKING:
    import redis

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


def node_meta(node_id: str, sessions: list[Any], errors_sent: int) -> dict[str, Any]:
    """What a node adds to its own statistics: who it is and what it holds."""
    return {"node": node_id, "host": socket.gethostname(), "pid": os.getpid(),
            "sessions": len(sessions),
            "connectedSessions": sum(1 for s in sessions if s.core.connected),
            "errorsSent": errors_sent}


def session_fields(session_id: str, record: dict[bytes, bytes], alive: bool) -> dict[str, Any]:
    """A session record held by another node as the scalar session fields of
    docs/PROTOCOL.md §12 (``alive``: its holder beats)."""
    node = text(record.get(b"node", b""))
    state = decode_state(record[b"state"])
    return {
        "id": session_id,
        "userId": state["user"],
        "connected": alive and record.get(b"connected") == b"1",
        "handshakeCompleted": state["handshake"],
        "lastActivity": state["last_activity"],
        "lastAck": str(state["last_ack"]),
        "lastDeliveredSeq": str(state["downstream_seq"]),
        "lastClientSeq": str(state["upstream_seq"]),
        "activeRuns": {run[0] for run in state["runs"]},
        "node": node if alive else None,
    }


class SessionsElsewhere:
    """The dashboard's rows for sessions other nodes hold or keep, from a bounded SCAN of
    the session records.

    A poll reads at most SCAN_LIMIT records: its cost stays bounded however many sessions
    the cluster holds (about 0.2 s at 10,000; see bench/dashboard_cluster.py); beyond it
    the list is partial. Answers are reused for CACHE_S, so any number of open dashboards
    costs one scan per second."""

    SCAN_LIMIT = 10_000
    CACHE_S = 1.0

    def __init__(self, redis_client: "redis.Redis", keys: Keys, node_id: str,
                 unreachable: Callable[[BaseException], None]) -> None:
        self.redis = redis_client
        self.keys = keys
        self.node_id = node_id
        self.unreachable = unreachable  # the hub degrades (an empty, partial answer here)
        #: recent answers: (user, limit) -> (monotonic time, answer)
        self._cache: dict[tuple[str | None, int], tuple[float, Any]] = {}

    def rows(self, user_id: str | None, limit: int, held_here: Callable[[str], bool],
             live_since: int) -> tuple[list[dict[str, Any]], bool]:
        """At most ``limit`` rows of ``user_id``'s sessions (every user's for None) that
        this node does not hold, newest activity first; and whether the scan was complete.
        ``live_since``: nodes that beat since then are alive."""
        now = time.monotonic()
        hit = self._cache.get((user_id, limit))
        if hit is not None and now - hit[0] < self.CACHE_S:
            answer: tuple[list[dict[str, Any]], bool] = hit[1]
            return answer
        answer = self._scan(user_id, limit, held_here, live_since)
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[(user_id, limit)] = (now, answer)
        return answer

    def _scan(self, user_id: str | None, limit: int, held_here: Callable[[str], bool],
              live_since: int) -> tuple[list[dict[str, Any]], bool]:
        complete = True
        try:
            keys: list[bytes] = []
            for key in self.redis.scan_iter(match=self.keys.session("*"), count=500):
                if len(keys) >= self.SCAN_LIMIT:
                    complete = False
                    break
                keys.append(key)
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "user", "node")
            owners = pipe.execute() if keys else []
            wanted = [key for key, (user, node) in zip(keys, owners, strict=True)
                      if user is not None and (user_id is None or user.decode() == user_id)
                      and (node or b"").decode() != self.node_id]
            pipe = self.redis.pipeline(transaction=False)
            for key in wanted:
                pipe.hmget(key, "node", "connected", "transport", "state")
            records = pipe.execute() if wanted else []
            alive = set(map(text, cast("list[bytes]", self.redis.zrangebyscore(
                self.keys.nodes, live_since, "+inf"))))
        except UNAVAILABLE as exc:
            self.unreachable(exc)
            return [], False
        rows: list[dict[str, Any]] = []
        prefix = len(self.keys.session(""))
        for key, (node, connected, transport, state) in zip(wanted, records, strict=True):
            if state is None:
                continue  # expired between the two reads
            session_id = key.decode()[prefix:]
            if held_here(session_id):
                continue
            data = orjson.loads(state)
            holder = (node or b"").decode()
            live = holder in alive
            rows.append({
                "id": session_id, "userId": data["user"],
                "transport": (transport or b"").decode() or None if live else None,
                "connected": live and connected == b"1",
                "handshakeCompleted": data["handshake"],
                "lastActivity": data["last_activity"],
                "lastClientSeq": data["upstream_seq"],
                "lastDeliveredSeq": data["downstream_seq"],
                "activeRuns": len(data["runs"]),
                "node": holder if live else None,
            })
        rows.sort(key=lambda r: r["lastActivity"], reverse=True)
        return rows[:limit], complete
