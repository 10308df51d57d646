"""/metrics for a cluster: every node's families, each sample labelled with its ``node``.

With several workers on one port a scrape lands on whichever worker accepts it, so each
node stores its own exposition in Redis every beat (``view.set_metrics_source``) and the
node that answers merges its fresh figures with the others' (at most a beat old).
The others' texts, parsed, are kept for ``OTHERS_TTL`` seconds (``OthersCache``): a flood
of scrapes parses every other node's text at most once a second, not once a scrape.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample


#: how long the other nodes' parsed figures are used (they are up to a beat old anyway)
OTHERS_TTL = 1.0


class OthersCache:
    """The other nodes' families, parsed at most once every OTHERS_TTL seconds."""

    def __init__(self, texts: Callable[[], dict[str, str]], ttl: float = OTHERS_TTL) -> None:
        self.texts, self.ttl = texts, ttl
        self.parses = 0  # how many times the texts were read and parsed (tests count it)
        self._at = -ttl - 1.0
        self._families: list[Metric] = []

    def families(self) -> list[Metric]:
        now = time.monotonic()
        if now - self._at > self.ttl:
            self._families = merge(self.texts())
            self._at = now
            self.parses += 1
        return self._families


def merge(expositions: dict[str, str], base: Iterable[Metric] = ()) -> list[Metric]:
    """One family per name, holding every node's samples with a ``node`` label (added to
    copies of the already merged ``base`` families, which are left as they are)."""
    families: dict[str, Metric] = {}
    for family in base:
        copy = families[family.name] = Metric(family.name, family.documentation,
                                              family.type, family.unit)
        copy.samples.extend(family.samples)
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


def cluster_registry(expositions: dict[str, str],
                     others: Iterable[Metric] = ()) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merge(expositions, others)))
    return registry
