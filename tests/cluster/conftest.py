"""Nodes of one cluster for a test: embedded servers on the test's Redis key prefix
(the ``redis_url`` and ``prefix`` fixtures are in tests/conftest.py), or on a private
redis-server the test may kill, flush or restart (never the shared one)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Callable, Iterator

import pytest
import redis

from protoflask import ProtoServer

from ..support import free_listener, wait_for


@pytest.fixture
def make_node(make_server: Callable[..., ProtoServer], redis_url: str,
              prefix: str) -> Callable[..., ProtoServer]:
    """An embedded server that is one node of this test's cluster."""
    def make(**config: Any) -> ProtoServer:
        return make_server(redisUrl=redis_url, redisPrefix=prefix, **config)
    return make


class PrivateRedis:
    """A redis-server of this test's own, on a free port, that the test can kill."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("the outage test needs redis-server on PATH (.ci/run installs it)")
        self.binary = binary
        listener = free_listener()
        self.port = listener.getsockname()[1]
        listener.close()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, what="the private redis-server")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


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
