"""The runnable examples in examples/, imported the way ``gunicorn --chdir examples/<name>
app:app`` or ``python examples/<name>/app.py`` would (their directory on sys.path), and
served by protoflask's embedded server on a free port."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest
from flask import Flask

from protoflask import ProtoServer

from ..support import ROOT, SECRET, WSClient

EXAMPLES = ROOT / "examples"

TEST_CONFIG = {"PROTOFLASK_PORT": 0, "PROTOFLASK_HOST": "127.0.0.1",
               "PROTOFLASK_JWT_SECRET": SECRET, "PROTOFLASK_ENABLE_LOGGING": False}


def import_example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """examples/<name>/app.py as the module ``example_<name>_app``."""
    module_name = f"example_{name}_app"
    if module_name in sys.modules:
        return sys.modules[module_name]
    directory = EXAMPLES / name
    monkeypatch.setenv("JWT_SECRET", SECRET)  # for the module-level ``app``
    monkeypatch.syspath_prepend(str(directory))
    spec = importlib.util.spec_from_file_location(module_name, directory / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


@pytest.fixture
def serve_example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ProtoServer]]:
    """serve_example(name, **app_config): a fresh app from the example's create_app,
    served on a free port; stopped after the test."""
    servers: list[ProtoServer] = []

    def serve(name: str, **app_config: Any) -> ProtoServer:
        module = import_example(name, monkeypatch)
        app: Flask = module.create_app({**TEST_CONFIG, **app_config})
        server: ProtoServer = app.extensions["protoflask"]
        server.start()
        servers.append(server)
        server.base_url = f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
        return server

    try:
        yield serve
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def ws() -> Iterator[Callable[..., WSClient]]:
    clients: list[WSClient] = []

    def connect(server: ProtoServer, user: str = "alice") -> WSClient:
        client = WSClient(server.base_url, server.issue_token(user))  # type: ignore[attr-defined]
        clients.append(client)
        return client

    try:
        yield connect
    finally:
        for client in clients:
            client.close()
