from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from protoflask import ProtoServer

from .support import CLIENTS, SECRET, BaseClient


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
