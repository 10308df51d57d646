"""A real Redis for the cluster tests (127.0.0.1:6379 unless PROTOFLASK_TEST_REDIS_URL
says otherwise; `.ci/run` starts one when none answers). Each test gets its own key
prefix, deleted afterwards, so tests and other users of that Redis never meet."""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator

import pytest
import redis

from protoflask import ProtoServer

REDIS_URL = os.environ.get("PROTOFLASK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"the cluster tests need Redis at {REDIS_URL} (.ci/run starts one): {exc}")
    return REDIS_URL


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = f"pftest-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(f"{name}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def make_node(make_server: Callable[..., ProtoServer], redis_url: str,
              prefix: str) -> Callable[..., ProtoServer]:
    """An embedded server that is one node of this test's cluster."""
    def make(**config: Any) -> ProtoServer:
        return make_server(redisUrl=redis_url, redisPrefix=prefix, **config)
    return make
