from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator

import pytest
import redis

from protoflask import ProtoServer

from .support import CLIENTS, SECRET, BaseClient, GunicornServer


@pytest.fixture(autouse=True)
def no_gunicorn_left() -> Iterator[None]:
    """Stop the gunicorn servers a test started and did not stop (see GunicornServer).
    Those of wider-scoped fixtures were started before this fixture's snapshot (pytest
    sets up wider scopes first) and are left to their fixtures."""
    before = set(GunicornServer.running)
    yield
    for server in GunicornServer.running - before:
        server.stop()


@pytest.fixture
def make_server() -> Iterator[Callable[..., ProtoServer]]:
    """Start embedded servers on free ports; every one is stopped after the test."""
    servers: list[ProtoServer] = []

    def make(app: Any = None, **config: Any) -> ProtoServer:
        base = {"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET, "enableLogging": False}
        server = ProtoServer({**base, **config}, app=app)
        server.start()
        servers.append(server)
        server.base_url = f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def server(make_server: Callable[..., ProtoServer]) -> ProtoServer:
    return make_server()


@pytest.fixture
def token(server: ProtoServer) -> str:
    return server.issue_token("alice")


@pytest.fixture(params=sorted(CLIENTS))
def transport(request: pytest.FixtureRequest) -> str:
    """Each test that uses it runs once per transport."""
    return request.param


@pytest.fixture
def make_client(transport: str) -> Iterator[Callable[..., BaseClient]]:
    """Connect test clients of the current transport; all are closed after the test."""
    clients: list[BaseClient] = []

    def make(server: ProtoServer, token: str | None = None, **kwargs: Any) -> BaseClient:
        cls = CLIENTS[kwargs.pop("transport", transport)]
        client = cls(server.base_url, token, **kwargs)  # type: ignore[attr-defined]
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in clients:
            client.close()


# -- a real Redis (the cluster tests and the cluster example) --------------------------------
# 127.0.0.1:6379 unless PROTOFLASK_TEST_REDIS_URL says otherwise; `.ci/run` starts one when
# none answers. Each test gets its own key prefix, deleted afterwards, so tests and other
# users of that Redis never meet.

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
