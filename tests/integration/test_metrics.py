"""/metrics: real traffic on each transport moves exactly the counters it should, read
back with prometheus_client's own parser; queue gauges, replay counters, refusals, the
OpenMetrics format, one registry per server, and the option that turns it off."""

from __future__ import annotations

from typing import Any

import gevent
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from protoflask import Tool

from ..support import GunicornServer, WSClient, hello_payload, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base_url: str) -> Samples:
    resp = requests.get(base_url + "/metrics", timeout=5)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name}


def test_traffic_moves_the_counters_by_exactly_what_was_sent(server, token, make_client,
                                                             transport):
    before = scrape(server.base_url)
    stats_before = server.get_stats()
    client = make_client(server, token)
    client.hello()
    during = scrape(server.base_url)
    assert value(during, "protoflask_connections_active", transport=transport) == 1
    assert delta(before, during, "protoflask_connections_opened_total", transport=transport) == 1
    assert value(during, "protoflask_sessions", state="connected") == 1

    for i in range(3):
        client.send("PING", "SYSTEM", {"nonce": f"n{i}"})
        client.recv_type("PONG", nonce=f"n{i}")
    client.send("MESSAGE_START", "USER", {"message_id": "t1", "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": "t1", "content": "hi"})
    client.send("MESSAGE_END", "USER", {"message_id": "t1"})
    client.recv_type("MESSAGE_END")
    client.send("TOOL_CALL", "USER", {"call_id": "c1", "tool": "add",
                                      "params": {"a": 2, "b": 3}})
    client.recv_type("TOOL_DONE", call_id="c1")
    client.send("NO_SUCH_TYPE", "USER", {})
    client.expect_error("UNSUPPORTED_TYPE")
    client.send_raw('{"not": "an envelope"}')
    client.expect_error("INVALID_MESSAGE")
    client.send("RUN_STARTED", "USER", {"run_id": "r1"})
    client.recv_type("RUN_STARTED", run_id="r1")
    client.send("RUN_FINISHED", "USER", {"run_id": "r1"})
    client.recv_type("RUN_FINISHED", run_id="r1")
    client.close()
    wait_for(lambda: value(scrape(server.base_url), "protoflask_connections_active",
                           transport=transport) == 0, what="the connection gauge to drop")
    after = scrape(server.base_url)

    received = {"HELLO": 1, "PING": 3, "MESSAGE_START": 1, "MESSAGE_PART": 1,
                "MESSAGE_END": 1, "TOOL_CALL": 1, "RUN_STARTED": 1, "RUN_FINISHED": 1,
                "unknown": 1, "invalid": 1}
    moved = {t: delta(before, after, "protoflask_messages_received_total", type=t)
             for t in by_label(after, "protoflask_messages_received_total", "type")}
    assert {t: n for t, n in moved.items() if n} == received
    # the spec's totalMessages counts the same upstream messages
    assert server.get_stats()["totalMessages"] - stats_before["totalMessages"] == \
        sum(received.values())

    sent = {"HELLO": 1, "PONG": 3, "MESSAGE_START": 1, "MESSAGE_PART": 1, "MESSAGE_END": 1,
            "TOOL_DONE": 1, "ERROR": 2, "RUN_STARTED": 1, "RUN_FINISHED": 1}
    moved = {t: delta(before, after, "protoflask_messages_sent_total", type=t)
             for t in by_label(after, "protoflask_messages_sent_total", "type")}
    assert {t: n for t, n in moved.items() if n} == sent

    assert delta(before, after, "protoflask_errors_total", code="UNSUPPORTED_TYPE") == 1
    assert delta(before, after, "protoflask_errors_total", code="INVALID_MESSAGE") == 1
    assert delta(before, after, "protoflask_tool_calls_total", tool="add",
                 status="completed") == 1
    assert delta(before, after, "protoflask_tool_duration_seconds_count", tool="add") == 1
    assert delta(before, after, "protoflask_runs_total", outcome="started") == 1
    assert delta(before, after, "protoflask_runs_total", outcome="finished") == 1
    assert value(after, "protoflask_runs_active") == 0
    assert value(after, "protoflask_connections_active", transport=transport) == 0
    assert value(after, "protoflask_sessions", state="disconnected") == 1  # kept for resume


def test_tool_durations_queue_depth_and_cancelled_calls(make_server):
    server = make_server(maxConcurrentRuns=1)
    release = {"go": False}

    def slow(params: dict, *_: Any) -> dict:
        while not release["go"]:  # flipped by the test thread; polled in the server's hub
            gevent.sleep(0.01)
        return {"ok": True}

    server.register_tool(Tool("slow", "Waits until the test lets it finish.",
                              {"type": "object"}, execute=slow))
    with WSClient(server.base_url, server.issue_token("alice")) as client:
        client.hello()
        for call_id in ("c1", "c2", "c3"):
            client.send("TOOL_CALL", "USER", {"call_id": call_id, "tool": "slow", "params": {}})
        client.recv_type("TOOL_UPDATE", call_id="c3", status="QUEUED")
        busy = scrape(server.base_url)
        assert value(busy, "protoflask_tools_running") == 1
        assert value(busy, "protoflask_tool_queue_depth") == 2
        client.send("TOOL_CANCEL", "USER", {"call_id": "c3"})
        client.recv_type("TOOL_DONE", call_id="c3", status="CANCELLED")
        assert value(scrape(server.base_url), "protoflask_tool_queue_depth") == 1
        release["go"] = True
        client.recv_type("TOOL_DONE", call_id="c1", status="OK")
        client.recv_type("TOOL_DONE", call_id="c2", status="OK")

    after = scrape(server.base_url)
    assert value(after, "protoflask_tool_calls_total", tool="slow", status="completed") == 2
    assert value(after, "protoflask_tool_calls_total", tool="slow", status="cancelled") == 1
    # the cancelled call never ran: two durations, and the buckets add up to the count
    assert value(after, "protoflask_tool_duration_seconds_count", tool="slow") == 2
    assert value(after, "protoflask_tool_duration_seconds_bucket", tool="slow", le="+Inf") == 2
    assert value(after, "protoflask_tool_duration_seconds_sum", tool="slow") > 0
    assert value(after, "protoflask_tools_running") == 0
    assert value(after, "protoflask_tool_queue_depth") == 0


def test_pending_outbound_gauges_follow_the_clients_credit(server, token):
    with WSClient(server.base_url, token) as client:
        client.send("HELLO", "SYSTEM", hello_payload(
            capabilities={"flow_control": {"initial_credit_messages": 1,
                                           "downstream": True}}))
        client.recv_type("HELLO")
        for mid in ("t1", "t2"):
            client.send("MESSAGE_START", "USER", {"message_id": mid, "content_type": "text/plain"})
            client.send("MESSAGE_END", "USER", {"message_id": mid})
        client.recv_type("MESSAGE_START")  # the one AGENT message the credit allows
        # five echo messages wait: END of the first text, START/PART/END of the second
        # (a text echo is START, PART, END; the first START used the only credit)
        held = wait_for(lambda: (s := scrape(server.base_url))
                        and value(s, "protoflask_pending_outbound_messages") == 5 and s,
                        what="five held messages")
        assert value(held, "protoflask_outbound_bytes") > 0
        client.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 10,
                                              "add_bytes": 0})
        client.recv_until(lambda m: sum(x["type"] == "MESSAGE_END" for x in client.received) == 2)
        # what sessions hold is summed by the heartbeat tick (/metrics walks no session)
        wait_for(lambda: value(scrape(server.base_url),
                               "protoflask_pending_outbound_messages") == 0,
                 what="the next tick to see the queue empty")


def test_replay_hits_and_misses(make_server):
    server = make_server(replayWindowSize=2)
    token = server.issue_token("alice")
    before = scrape(server.base_url)
    first = WSClient(server.base_url, token)
    try:
        first.hello()  # downstream seq 1
        for i in range(3):  # seq 2, 3, 4; the window keeps 3 and 4
            first.send("PING", "SYSTEM", {"nonce": f"n{i}"})
            first.recv_type("PONG", nonce=f"n{i}")
        session_id = first.session_id
        first.drop()
    finally:
        first.close()
    with WSClient(server.base_url, token, session=session_id, last_seq=2) as resumed:
        assert [resumed.recv()["seq"] for _ in range(2)] == ["3", "4"]
        resumed.envelopes = first.envelopes  # upstream seq continues across reconnects
        resumed.send("REPLAY_REQUEST", "SYSTEM", {"from_seq": "1"})
        resumed.expect_error("REPLAY_UNAVAILABLE")
    after = scrape(server.base_url)
    assert delta(before, after, "protoflask_replays_total", source="resume",
                 result="complete") == 1
    assert delta(before, after, "protoflask_replays_total", source="request",
                 result="unavailable") == 1
    assert delta(before, after, "protoflask_replays_total", source="resume",
                 result="unavailable") == 0
    # two for the resume, two (what the window still had) for the request
    assert delta(before, after, "protoflask_replayed_messages_total") == 4


def test_refused_connections_are_counted_by_code(server):
    before = scrape(server.base_url)
    assert requests.get(server.base_url + "/proto/sse", timeout=5).status_code == 401
    assert requests.get(server.base_url + "/proto/sse?token=nope", timeout=5).status_code == 401
    assert requests.post(server.base_url + "/proto/stream?token=nope", data=b"{}",
                         timeout=5).status_code == 401
    after = scrape(server.base_url)
    assert delta(before, after, "protoflask_connections_refused_total", code="MISSING_TOKEN") == 1
    assert delta(before, after, "protoflask_connections_refused_total", code="INVALID_TOKEN") == 2
    assert value(after, "protoflask_connections_active", transport="sse") == 0


def test_openmetrics_when_the_scraper_asks_for_it(server):
    resp = requests.get(server.base_url + "/metrics", timeout=5,
                        headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert resp.text.rstrip().endswith("# EOF")
    assert "protoflask_messages_received_total" in resp.text


def test_each_server_has_its_own_registry(make_server):
    quiet, busy = make_server(), make_server()
    with WSClient(busy.base_url, busy.issue_token("alice")) as client:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": "x"})
        client.recv_type("PONG")
    assert value(scrape(busy.base_url), "protoflask_messages_received_total", type="PING") == 1
    assert value(scrape(quiet.base_url), "protoflask_messages_received_total", type="PING") == 0
    assert busy.metrics_registry is not quiet.metrics_registry


def test_an_application_adds_its_own_metrics_to_the_servers_registry(server):
    from prometheus_client import Counter

    orders = Counter("shop_orders", "Orders placed.", registry=server.metrics_registry)
    orders.inc(3)
    assert value(scrape(server.base_url), "shop_orders_total") == 3


@pytest.mark.parametrize("option", [{"metrics": False}, {"metrics": False, "dashboard": False}])
def test_metrics_off_is_404(make_server, option):
    server = make_server(**option)
    assert requests.get(server.base_url + "/metrics", timeout=5).status_code == 404
    assert requests.get(server.base_url + "/stats", timeout=5).status_code == 200


def test_metrics_and_the_page_under_gunicorn():
    gunicorn = GunicornServer()
    try:
        samples = scrape(gunicorn.base_url)
        assert value(samples, "protoflask_uptime_seconds") > 0
        page = requests.get(gunicorn.base_url + "/", timeout=5)
        assert page.status_code == 200 and "protoflask" in page.text
        script = requests.get(gunicorn.base_url + "/dashboard/static/protoclient.mjs", timeout=5)
        assert script.status_code == 200 and "ProtoClient" in script.text
    finally:
        gunicorn.stop()
