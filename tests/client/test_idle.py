"""An idle Python client sends nothing but its PONG to each server PING (counted on the
live server: /stats totalMessages counts every upstream message handled), per transport.
Before: each PING advanced the last seq, and the idle ACK of it followed every PONG."""

from __future__ import annotations

import threading

from protoflask.client import Client

from ..support import timeout, wait_for

PINGS = 6


class PingCounter:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, msg: dict) -> None:
        if msg["type"] == "PING":
            with self._lock:
                self.count += 1


def test_an_idle_client_only_answers_the_heartbeat(make_server, transport):
    # a heartbeat longer than the client's 0.25 s idle-ACK delay, so an ACK could follow
    server = make_server(heartbeatInterval=600, heartbeatTimeout=5000)
    pings = PingCounter()
    with Client(server.base_url, server.issue_token("idle"), transport=transport,
                on_message=pings, timeout=timeout(10)).connect() as client:
        assert client.call_tool("add", {"a": 1, "b": 2}, timeout=timeout(10)) == {"result": 3}
        wait_for(lambda: pings.count >= 2, within=10, what="two heartbeats after the call")
        before, start = server.get_stats()["totalMessages"], pings.count
        wait_for(lambda: pings.count >= start + PINGS, within=20, what=f"{PINGS} heartbeats")
        sent = server.get_stats()["totalMessages"] - before
    assert PINGS - 1 <= sent <= PINGS + 1, \
        f"{transport}: {sent} upstream messages over {PINGS} heartbeats"
