"""A Redis password in ``REDIS_URL`` never reaches a log line: a node on a private
redis-server with ``requirepass`` works through it, and when that Redis goes away the
node's "unreachable" line names the server with ``***`` for the password."""

from __future__ import annotations

import logging
from typing import Callable

import pytest
import requests

from protoflask import ProtoServer
from protoflask.cluster.redis_client import display_url

from ..support import PrivateRedis, WSClient, timeout, wait_for

PASSWORD = "not-in-any-log-0f3a9"


def test_display_url_hides_only_the_password() -> None:
    assert display_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert display_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert display_url("rediss://u:p%40ss@h:1") == "rediss://u:***@h:1"
    assert display_url("redis://h:1/0") == "redis://h:1/0"
    assert display_url("redis+sentinel://:pw@s1:26379,s2:26379/pf") == \
        "redis+sentinel://:***@s1:26379,s2:26379/pf"


def test_the_password_stays_out_of_the_logs(make_server: Callable[..., ProtoServer],
                                            caplog: pytest.LogCaptureFixture) -> None:
    redis_server = PrivateRedis(password=PASSWORD)
    try:
        node = make_server(redisUrl=redis_server.url)
        client = WSClient(node.base_url, node.issue_token("alice"))
        client.hello()  # Redis with its password works
        client.close()
        with caplog.at_level(logging.WARNING, logger="protoflask"):
            redis_server.kill()
            wait_for(lambda: requests.get(node.base_url + "/health", timeout=timeout(5))
                     .json()["status"] == "degraded", within=20, what="the node degraded")
            wait_for(lambda: "unreachable" in caplog.text, within=10,
                     what="the unreachable line")
        assert f"127.0.0.1:{redis_server.port}" in caplog.text
        assert ":***@" in caplog.text
        assert PASSWORD not in caplog.text
    finally:
        redis_server.kill()
