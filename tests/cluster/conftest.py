"""Nodes of one cluster for a test: embedded servers on the test's Redis key prefix
(the ``redis_url`` and ``prefix`` fixtures are in tests/conftest.py), or on a private
redis-server the test may kill, flush or restart (never the shared one)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from protoflask import ProtoServer

from ..support import PrivateRedis


@pytest.fixture
def make_node(make_server: Callable[..., ProtoServer], redis_url: str,
              prefix: str) -> Callable[..., ProtoServer]:
    """An embedded server that is one node of this test's cluster."""
    def make(**config: Any) -> ProtoServer:
        return make_server(redisUrl=redis_url, redisPrefix=prefix, **config)
    return make


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def two_nodes(make_server: Callable[..., ProtoServer],
              private_redis: PrivateRedis) -> tuple[ProtoServer, ProtoServer]:
    """Nodes a and b on the private Redis."""
    return make_server(redisUrl=private_redis.url), make_server(redisUrl=private_redis.url)
