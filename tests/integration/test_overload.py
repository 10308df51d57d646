"""Overload: connections beyond maxConnections are refused cleanly on every transport and
the count recovers; tool storms stay within maxConcurrentRuns, queue up to toolQueueSize,
refuse the rest, answer every call exactly once, and leave memory flat (measured in the
server's own process under gunicorn)."""

from __future__ import annotations

import collections

import pytest

from ..hardening_support import (
    live_with_baseline,
    call_endpoint, error_code, settled, vitals,
)
from ..support import SSEClient, StreamClient, WSClient, wait_for

CLIENT_OF = {"websocket": WSClient, "sse": SSEClient, "stream": StreamClient}


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def small(request):
    yield from live_with_baseline(request.param, maxConnections=3, maxConnectionsPerUser=3,
                                  maxConcurrentRuns=3,
                                  toolQueueSize=5)


def test_connections_beyond_max_are_refused_and_the_count_recovers(small):
    token = small.token("crowd")
    held = [cls(small.base_url, token) for cls in CLIENT_OF.values()]
    try:
        for client in held:
            client.hello()
        assert vitals(small.base_url)["activeConnections"] == 3
        for name in ("websocket", "sse", "stream"):
            status, _, body = call_endpoint(small.base_url, name, token)
            assert (status, error_code(body)) == (503, "MAX_CONNECTIONS"), (name, body)
        # upstream POSTs are not live transports: they still get through
        sse = held[1]
        assert isinstance(sse, SSEClient)
        sse.send("PING", "SYSTEM", {"nonce": "full"})
        sse.recv_type("PONG", nonce="full")
        status, _, _ = call_endpoint(small.base_url, "stream-post", token,
                                     session=held[2].session_id)
        assert status == 202
        # one goes, one more gets in, on each transport in turn
        for name, cls in CLIENT_OF.items():
            gone = held.pop(0)
            gone.close()
            wait_for(lambda: vitals(small.base_url)["activeConnections"] == 2,
                     what="the slot back")
            newcomer = cls(small.base_url, token)
            newcomer.hello()
            held.append(newcomer)
            status, _, body = call_endpoint(small.base_url, name, token)
            assert error_code(body) == "MAX_CONNECTIONS", name
    finally:
        for client in held:
            client.close()
    settled(small.base_url, small.baseline)  # type: ignore[attr-defined]


def storm(client: WSClient, calls: int, tag: str) -> collections.Counter:
    for i in range(calls):
        client.send("TOOL_CALL", payload={"call_id": f"{tag}-{i}", "tool": "sleep",
                                          "params": {"seconds": 0.15}})
    done: dict[str, dict] = {}
    while len(done) < calls:
        msg = client.recv_type("TOOL_DONE", within=20)
        assert msg["payload"]["call_id"] not in done, "a second TOOL_DONE"
        done[msg["payload"]["call_id"]] = msg["payload"]
    outcome = collections.Counter()
    for payload in done.values():
        outcome[payload["status"] if payload["status"] == "OK"
                else payload["error"]["code"]] += 1
    outcome["QUEUED"] = sum(1 for m in client.received if m["type"] == "TOOL_UPDATE"
                            and m["payload"]["status"] == "QUEUED"
                            and m["payload"]["call_id"].startswith(f"{tag}-"))
    return outcome


def test_tool_storms_are_bounded_and_memory_stays_flat(small):
    client = WSClient(small.base_url, small.token("storm"))
    try:
        client.hello()
        peak_running = 0
        first = storm(client, 20, "warm")
        assert first == {"OK": 8, "MAX_RUNS_EXCEEDED": 12, "QUEUED": 5}, first
        rss_after_first = vitals(small.base_url)["rss"]
        for round_ in range(6):
            for i in range(20):
                client.send("TOOL_CALL", payload={"call_id": f"s{round_}-{i}", "tool": "sleep",
                                                  "params": {"seconds": 0.15}})
            v = vitals(small.base_url)
            peak_running = max(peak_running, v["runningTools"])
            assert v["runningTools"] <= 3 and v["queuedTools"] <= 5, v
            done = 0
            while done < 20:
                client.recv_type("TOOL_DONE", within=20)
                done += 1
        assert peak_running == 3
        # every storm ended: nothing runs, nothing waits, memory did not grow with them
        final = wait_for(lambda: (v := vitals(small.base_url))["runningTools"] == 0 and v,
                         what="the storms to end")
        assert final["queuedTools"] == 0
        assert final["rss"] - rss_after_first < 8 * 1024 * 1024, (rss_after_first, final)
    finally:
        client.close()
    settled(small.base_url, small.baseline)  # type: ignore[attr-defined]
