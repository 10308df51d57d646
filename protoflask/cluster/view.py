"""What only a cluster answers: other nodes' sessions and figures, the cluster's health
and merged /metrics (the hub's ``ClusterView``: ``RedisHub.view``). The dashboard,
/stats, /health and /metrics take it; nothing else in the cluster reads through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import orjson

from ..core.errors import ClusterUnavailable
from ..clock import now_ms
from .nodes import SessionsElsewhere, aggregate_stats, session_fields
from .redis_client import UNAVAILABLE
from .settling import NODE_TTL_MS

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .hub import RedisHub


class RedisView:
    """The cluster as one node reads it from Redis."""

    def __init__(self, hub: "RedisHub") -> None:
        self.hub = hub
        self.store = hub.store
        self.node_id = hub.node_id
        self.elsewhere = SessionsElsewhere(hub.redis, hub.keys, hub.node_id, hub.went_down)
        #: the node's /metrics text, stored every beat for the others' /metrics to merge
        self.metrics_source: Callable[[], bytes] | None = None
        self._others: Any = None  # metrics.OthersCache, built on the first cluster scrape

    def set_metrics_source(self, source: Callable[[], bytes]) -> None:
        self.metrics_source = source

    def health(self) -> str:
        return self.hub.health()

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        try:
            record = self.store.record(session_id)
            if not record:
                return None
            node = record.get(b"node", b"").decode()
            alive = bool(node) and self.store.node_alive(node)
        except UNAVAILABLE as exc:
            self.hub.went_down(exc)
            raise ClusterUnavailable("Redis is unreachable") from exc
        return session_fields(session_id, record, alive)

    def sessions_elsewhere(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                         bool]:
        hub = self.hub
        return self.elsewhere.rows(user_id, limit, lambda sid: hub.get(sid) is not None,
                                   now_ms() - NODE_TTL_MS)

    def cluster_stats(self, local: dict[str, Any]) -> dict[str, Any]:
        own = {**local, **self.hub.node_meta()}
        others: list[dict[str, Any]] = []
        try:
            ids = self.other_live_nodes()
            if ids:
                others = [orjson.loads(raw) for raw in self.store.node_reports(ids) if raw]
        except UNAVAILABLE as exc:
            self.hub.went_down(exc)
        return {**aggregate_stats([own, *others]), "node": self.node_id,
                "cluster": self.hub.health()}

    def metrics_registry(self, local: "CollectorRegistry") -> "CollectorRegistry":
        from prometheus_client import generate_latest

        from .metrics import OthersCache, cluster_registry

        if self._others is None:
            self._others = OthersCache(self.node_metrics)
        return cluster_registry({self.node_id: generate_latest(local).decode()},
                                self._others.families())

    def node_metrics(self) -> dict[str, str]:
        """The other live nodes' stored /metrics texts, by node id."""
        try:
            ids = self.other_live_nodes()
            texts = self.store.node_metrics(ids) if ids else []
        except UNAVAILABLE as exc:
            self.hub.went_down(exc)
            return {}
        return {n: t.decode() for n, t in zip(ids, texts, strict=True) if t}

    def other_live_nodes(self) -> list[str]:
        """The ids of the other nodes that beat within NODE_TTL_MS."""
        return [n for n in self.store.nodes_since(now_ms() - NODE_TTL_MS) if n != self.node_id]
