"""The plain HTTP side of a real server: /health, /stats, CORS, gzip, WebSocket refusals
before the upgrade, and access logs (docs/PROTOCOL.md §1, §9-§11)."""

from __future__ import annotations

import gzip
import logging
import threading
import time
from typing import Any, Callable, Iterator

import jwt
import orjson
import pytest
import requests
from websockets.exceptions import InvalidStatus

from protoflask import ProtoServer

from ..support import SECRET, WSClient, timeout, wait_for

STATS_FIELDS = ("totalConnections", "activeConnections", "totalMessages", "messagesPerSecond",
                "averageLatency", "errorRate", "uptime")


@pytest.fixture
def ws() -> Iterator[Callable[..., WSClient]]:
    """Real WebSocket clients, all closed after the test."""
    clients: list[WSClient] = []

    def make(server: ProtoServer, token: str | None, **query: Any) -> WSClient:
        client = WSClient(server.base_url, token, **query)  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def get(server: ProtoServer, path: str, **kwargs: Any) -> requests.Response:
    return requests.get(server.base_url + path, timeout=timeout(5), **kwargs)  # type: ignore


def stats(server: ProtoServer) -> dict[str, Any]:
    resp = get(server, "/stats")
    assert resp.status_code == 200
    return resp.json()


def refused(server: ProtoServer, token: str | None, **query: Any) -> tuple[int, dict, Any]:
    """Open a WebSocket that the server must refuse before the upgrade."""
    with pytest.raises(InvalidStatus) as info:
        WSClient(server.base_url, token, **query)  # type: ignore[attr-defined]
    response = info.value.response
    return response.status_code, orjson.loads(bytes(response.body)), response.headers


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- /health --------------------------------------------------------------------------


def test_health_needs_no_token(server: ProtoServer) -> None:
    resp = get(server, "/health")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    body = resp.json()
    assert body["status"] == "ok"
    assert is_number(body["uptime"]) and body["uptime"] >= 0
    assert body["activeConnections"] == 0
    assert body["totalConnections"] == 0


def test_health_counts_connections(server: ProtoServer, token: str, ws) -> None:
    client = ws(server, token)
    client.hello()
    body = get(server, "/health").json()
    assert body["activeConnections"] == 1
    assert body["totalConnections"] == 1
    client.close()
    wait_for(lambda: get(server, "/health").json()["activeConnections"] == 0,
             what="activeConnections back to 0 in /health")
    assert get(server, "/health").json()["totalConnections"] == 1


def test_health_uptime_grows(server: ProtoServer) -> None:
    first = get(server, "/health").json()["uptime"]
    wait_for(lambda: get(server, "/health").json()["uptime"] > first, what="uptime to grow")


# -- /stats ---------------------------------------------------------------------------


def test_stats_fields_and_types(server: ProtoServer) -> None:
    resp = get(server, "/stats")  # no token needed either
    assert resp.status_code == 200
    body = resp.json()
    assert set(STATS_FIELDS) <= set(body)
    for name in ("totalConnections", "activeConnections", "totalMessages"):
        assert isinstance(body[name], int) and not isinstance(body[name], bool), name
    for name in ("messagesPerSecond", "averageLatency", "errorRate", "uptime"):
        assert is_number(body[name]), name
    assert body["totalMessages"] == 0 and body["errorRate"] == 0
    assert body["messagesPerSecond"] == 0 and body["averageLatency"] == 0
    assert body["uptime"] >= 0
    assert server.get_stats().keys() >= set(STATS_FIELDS)


def test_stats_count_upstream_messages_valid_or_not(server: ProtoServer, token: str,
                                                    ws) -> None:
    client = ws(server, token)
    client.send("PING", "SYSTEM", {"nonce": "before-hello"})  # 1: valid before HELLO
    client.recv_type("PONG", nonce="before-hello")
    client.hello()  # 2
    client.send_raw("this is not json")  # 3: ERROR INVALID_MESSAGE
    client.expect_error("INVALID_MESSAGE")
    client.send("NO_SUCH_TYPE", "USER", {})  # 4: ERROR UNSUPPORTED_TYPE
    client.expect_error("UNSUPPORTED_TYPE")
    client.send("PING", "SYSTEM", {"nonce": "n5"})  # 5
    client.recv_type("PONG", nonce="n5")

    body = wait_for(lambda: (lambda s: s if s["totalMessages"] == 5 else None)(stats(server)),
                    what="totalMessages == 5")
    assert body["errorRate"] == pytest.approx(2 / 5)
    # docs/PROTOCOL.md §10 Statistics: the count over the last 10 s, over the uptime while younger
    window_s = min(10_000, body["uptime"]) / 1000
    assert body["messagesPerSecond"] == pytest.approx(5 / window_s, rel=0.05)
    assert body["averageLatency"] >= 0
    assert body["totalConnections"] == 1 and body["activeConnections"] == 1


def test_stats_active_connections_follow_connect_and_close(server: ProtoServer, token: str,
                                                           ws) -> None:
    assert stats(server)["activeConnections"] == 0
    first = ws(server, token)
    first.hello()
    second = ws(server, token)
    second.hello()
    body = stats(server)
    assert body["activeConnections"] == 2 and body["totalConnections"] == 2
    first.close()
    wait_for(lambda: stats(server)["activeConnections"] == 1, what="one connection left")
    second.close()
    wait_for(lambda: stats(server)["activeConnections"] == 0, what="no connection left")
    assert stats(server)["totalConnections"] == 2


# -- CORS -----------------------------------------------------------------------------


def test_cors_headers_when_enabled(server: ProtoServer) -> None:
    resp = get(server, "/health", headers={"Origin": "https://app.example"})
    assert resp.headers["Access-Control-Allow-Origin"] in ("https://app.example", "*")
    assert "Proto-Session" in resp.headers.get("Access-Control-Expose-Headers", "")


def test_cors_preflight_when_enabled(server: ProtoServer) -> None:
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET",
               "Access-Control-Request-Headers": "Authorization"}
    resp = requests.options(server.base_url + "/stats",  # type: ignore[attr-defined]
                            timeout=timeout(5), headers=headers)
    assert resp.status_code in (200, 204)
    assert resp.headers["Access-Control-Allow-Origin"] in ("https://app.example", "*")
    assert "GET" in resp.headers["Access-Control-Allow-Methods"]
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert "authorization" in resp.headers["Access-Control-Allow-Headers"].lower()


def test_no_cors_headers_when_disabled(make_server) -> None:
    server = make_server(enableCORS=False)
    resp = get(server, "/health", headers={"Origin": "https://app.example"})
    assert resp.status_code == 200
    assert "Access-Control-Allow-Origin" not in resp.headers
    pre = requests.options(server.base_url + "/stats", timeout=timeout(5), headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "GET"})
    assert "Access-Control-Allow-Origin" not in pre.headers
    assert "Access-Control-Allow-Methods" not in pre.headers


# -- gzip -----------------------------------------------------------------------------


def raw_get(server: ProtoServer, path: str, accept_encoding: str) -> tuple[requests.Response,
                                                                           bytes]:
    resp = requests.get(server.base_url + path, stream=True, timeout=timeout(5),  # type: ignore
                        headers={"Accept-Encoding": accept_encoding})
    raw = resp.raw.read(decode_content=False)
    resp.close()
    return resp, raw


def test_gzip_json_when_enabled_and_accepted(server: ProtoServer) -> None:
    resp, raw = raw_get(server, "/stats", "gzip")
    assert resp.headers.get("Content-Encoding") == "gzip"
    assert "Accept-Encoding" in resp.headers.get("Vary", "")
    assert raw[:2] == b"\x1f\x8b"
    body = orjson.loads(gzip.decompress(raw))
    assert set(STATS_FIELDS) <= set(body)


def test_no_gzip_when_client_does_not_accept_it(server: ProtoServer) -> None:
    resp, raw = raw_get(server, "/stats", "identity")
    assert "Content-Encoding" not in resp.headers
    assert set(STATS_FIELDS) <= set(orjson.loads(raw))


def test_no_gzip_when_compression_disabled(make_server) -> None:
    server = make_server(enableCompression=False)
    resp, raw = raw_get(server, "/stats", "gzip")
    assert "Content-Encoding" not in resp.headers
    assert set(STATS_FIELDS) <= set(orjson.loads(raw))


# -- WebSocket refusals before the upgrade (docs/PROTOCOL.md §11) ---------------------------


def test_refused_without_token(server: ProtoServer) -> None:
    status, body, headers = refused(server, None)
    assert status == 401
    assert body["error"]["code"] == "MISSING_TOKEN"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("bad", ["garbage", "a.b.c"])
def test_refused_with_invalid_token(server: ProtoServer, bad: str) -> None:
    status, body, _ = refused(server, bad)
    assert (status, body["error"]["code"]) == (401, "INVALID_TOKEN")


def test_refused_with_token_of_another_secret(server: ProtoServer) -> None:
    other = ProtoServer({"jwtSecret": "some-other-secret-that-is-long-enough!!"})
    status, body, _ = refused(server, other.issue_token("alice"))
    assert (status, body["error"]["code"]) == (401, "INVALID_TOKEN")


def test_refused_with_expired_token(server: ProtoServer) -> None:
    expired = jwt.encode({"sub": "alice", "exp": int(time.time()) - 10}, SECRET,
                         algorithm="HS256")
    status, body, _ = refused(server, expired)
    assert (status, body["error"]["code"]) == (401, "INVALID_TOKEN")


def test_bearer_header_is_accepted_on_websocket(server: ProtoServer, token: str) -> None:
    client = WSClient(server.base_url, None,  # type: ignore[attr-defined]
                      headers={"Authorization": f"Bearer {token}"})
    try:
        assert client.hello()["payload"]["session"]
    finally:
        client.close()


def test_refused_beyond_max_connections(make_server, ws) -> None:
    server = make_server(maxConnections=1)
    token = server.issue_token("alice")
    first = ws(server, token)
    first.hello()
    status, body, _ = refused(server, token)
    assert (status, body["error"]["code"]) == (503, "MAX_CONNECTIONS")
    # the refused attempt did not count, and the first connection still works
    assert server.get_stats()["activeConnections"] == 1
    first.send("PING", "SYSTEM", {"nonce": "still-here"})
    first.recv_type("PONG", nonce="still-here")
    first.close()
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="slot freed")
    ws(server, token).hello()


def test_refused_for_unknown_session(server: ProtoServer, token: str) -> None:
    status, body, _ = refused(server, token, session="unknown", last_seq="0")
    assert (status, body["error"]["code"]) == (404, "SESSION_NOT_FOUND")
    status, body, _ = refused(server, token, session="unknown")
    assert (status, body["error"]["code"]) == (404, "SESSION_NOT_FOUND")
    assert server.get_stats()["activeConnections"] == 0


def test_auth_is_checked_before_max_connections(make_server, ws) -> None:
    server = make_server(maxConnections=1)
    ws(server, server.issue_token("alice")).hello()
    status, body, _ = refused(server, None)
    assert (status, body["error"]["code"]) == (401, "MISSING_TOKEN")


# -- access logs ----------------------------------------------------------------------


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """Capture protoflask's records from the server's thread (caplog's handler sits on
    the root logger, which every thread's records reach while propagation is on)."""
    monkeypatch.setattr(logging.getLogger("protoflask"), "propagate", True)
    caplog.set_level(logging.INFO, logger="protoflask")
    return caplog


def access_lines(caplog: pytest.LogCaptureFixture, needle: str = "") -> list[str]:
    return [r.getMessage() for r in list(caplog.records)
            if r.name == "protoflask.access" and needle in r.getMessage()]


def test_one_access_line_per_request(make_server, logs) -> None:
    server = make_server(enableLogging=True)
    assert get(server, "/health").status_code == 200
    line = wait_for(lambda: access_lines(logs, "/health"), what="an access line")[0]
    assert "GET" in line and "200" in line
    assert any(r.thread != threading.get_ident() for r in logs.records
               if r.name == "protoflask.access")  # emitted in the server's thread
    # a later request gets its own line; the first still has exactly one
    get(server, "/stats")
    wait_for(lambda: access_lines(logs, "/stats"), what="the /stats line")
    assert len(access_lines(logs, "/health")) == 1
    assert len(access_lines(logs, "/stats")) == 1


def test_no_access_lines_when_logging_disabled(make_server, logs) -> None:
    server = make_server(enableLogging=False)
    get(server, "/health")
    get(server, "/stats")
    token = server.issue_token("alice")
    client = WSClient(server.base_url, token)  # type: ignore[attr-defined]
    client.hello()
    client.close()
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="close")
    assert access_lines(logs) == []


def test_tokens_never_logged(make_server, logs, ws) -> None:
    server = make_server(enableLogging=True)
    token = server.issue_token("alice")
    bogus = "bogus.token-value.that-must-not-leak"
    get(server, f"/health?token={token}&x=1")
    get(server, "/stats", headers={"Authorization": f"Bearer {token}"})
    refused(server, bogus)
    client = ws(server, token)
    client.hello()
    client.send("PING", "SYSTEM", {"nonce": "n"})
    client.recv_type("PONG")
    client.close()
    wait_for(lambda: access_lines(logs, "websocket closed"), what="the close line")
    wait_for(lambda: len(access_lines(logs)) >= 4, what="the request lines")
    assert any("token=[redacted]" in line for line in access_lines(logs, "/health"))
    assert any("websocket open" in line and "user=alice" in line for line in access_lines(logs))
    for record in logs.records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        assert token not in text, record.getMessage()
        assert bogus not in text, record.getMessage()
        assert token.split(".")[2] not in text  # not even the signature part


def test_message_burst_is_not_logged_per_message(make_server, logs, ws) -> None:
    server = make_server(enableLogging=True)
    client = ws(server, server.issue_token("alice"))
    client.hello()
    wait_for(lambda: access_lines(logs, "websocket open"), what="the open line")
    before = len([r for r in logs.records if r.name.startswith("protoflask")])
    for i in range(50):
        client.send("PING", "SYSTEM", {"nonce": f"burst-{i}"})
    for i in range(50):
        client.recv_type("PONG", nonce=f"burst-{i}")
    client.close()
    wait_for(lambda: access_lines(logs, "websocket closed"), what="the close line")
    during = [r.getMessage() for r in logs.records if r.name.startswith("protoflask")][before:]
    assert len(during) <= 2, during  # the close line, not one per message
    assert not any("PING" in line or "burst-" in line for line in during)
