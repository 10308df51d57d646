"""protoflask.client and the TypeScript client (clients/js) through nginx round robin
over two nodes: a POST that reaches the
node not holding the session while Redis is unreachable is 503 CLUSTER_UNAVAILABLE with
Retry-After; the client posts it again (nginx sends the retry to the other node) rather
than tearing its connection down and resuming."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import json
import subprocess

import pytest

from protoflask import ProtoServer
from protoflask.client import Client

from ..interop.conftest import need_node, need_program
from ..nginx import Nginx
from ..support import PrivateRedis, built_js_client


@pytest.fixture
def balanced(two_nodes: tuple[ProtoServer, ProtoServer],
             tmp_path: Path) -> Iterator[Nginx]:
    proxy = Nginx(need_program("nginx", "nginx"), [n.port for n in two_nodes], tmp_path)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.parametrize("transport", ["sse", "stream"])
def test_a_post_answered_503_is_retried_not_torn_down(
        two_nodes: tuple[ProtoServer, ProtoServer], private_redis: PrivateRedis,
        balanced: Nginx, transport: str) -> None:
    a, _ = two_nodes
    client = Client(balanced.base_url, a.issue_token("alice"), transport=transport)
    client.connect()
    try:
        assert client.call_tool("add", {"a": 1, "b": 1}) == {"result": 2}
        private_redis.kill()
        # round robin: of these POSTs about half reach the node that does not hold the
        # session, which cannot ask Redis where it is: 503, retried
        results = [client.call_tool("add", {"a": n, "b": 1}, timeout=20) for n in range(6)]
        assert results == [{"result": n + 1} for n in range(6)]
        assert client.reconnects == 0
    finally:
        client.close()


DRIVER = Path(__file__).resolve().parent / "node" / "retry_503.mjs"
DIST = Path(__file__).resolve().parents[2] / "clients" / "js" / "dist" / "index.js"


@pytest.mark.parametrize("transport", ["sse", "stream"])
def test_the_typescript_client_retries_a_post_answered_503_too(
        two_nodes: tuple[ProtoServer, ProtoServer], private_redis: PrivateRedis,
        balanced: Nginx, transport: str) -> None:
    node = need_node()
    built_js_client()  # DIST, compiled from this checkout's sources
    a, _ = two_nodes
    proc = subprocess.Popen([node, str(DRIVER), balanced.base_url, a.issue_token("alice"),
                             transport], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        private_redis.kill()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        assert out == {"results": [n + 1 for n in range(6)], "reconnects": 0}
    finally:
        proc.kill()
        proc.wait()
