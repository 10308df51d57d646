"""Nodes of one cluster for a test: embedded servers on the test's Redis key prefix
(the ``redis_url`` and ``prefix`` fixtures are in tests/conftest.py)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from protoflask import ProtoServer


@pytest.fixture
def make_node(make_server: Callable[..., ProtoServer], redis_url: str,
              prefix: str) -> Callable[..., ProtoServer]:
    """An embedded server that is one node of this test's cluster."""
    def make(**config: Any) -> ProtoServer:
        return make_server(redisUrl=redis_url, redisPrefix=prefix, **config)
    return make
