"""/metrics for a cluster: every node's families, each sample labelled with its ``node``.

With several workers on one port a scrape lands on whichever worker accepts it, so each
node stores its own exposition in Redis every beat (``view.set_metrics_source``) and the
node that answers merges its fresh figures with the others' (at most a beat old).
"""

from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample


def merge(expositions: dict[str, str]) -> list[Metric]:
    """One family per name, holding every node's samples with a ``node`` label."""
    families: dict[str, Metric] = {}
    for node, text in expositions.items():
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
            merged.samples.extend(
                Sample(s.name, {**s.labels, "node": node}, s.value, s.timestamp, s.exemplar)
                for s in family.samples)
    return list(families.values())


class _Merged(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def cluster_registry(expositions: dict[str, str]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merge(expositions)))
    return registry
