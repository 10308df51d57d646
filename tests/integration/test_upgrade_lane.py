"""The WebSocket upgrade on protoflask's own app skips Flask's request cycle (post_lane.py,
issue 29): an admitted upgrade is served as the route serves it, a refused one is answered
byte for byte as Flask's route and hooks answer it (and counted once), and the lane steps
aside whenever an application could see the difference."""

from __future__ import annotations

import base64
import os
import re
from typing import Any, Callable

import pytest

from ..support import WSClient, open_http, read_until
from .test_post_lane import FlaskCycle, own  # noqa: F401  (the fixture)


def raw_upgrade(base_url: str, query: str, headers: dict[str, str] | None = None) -> bytes:
    """The head answered to one upgrade request (Date removed), then the socket closed."""
    key = base64.b64encode(os.urandom(16)).decode()
    sock = open_http(base_url, "GET", f"/proto/websocket?{query}", {
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Version": "13", **(headers or {})})
    data = read_until(sock, lambda data: b"\r\n\r\n" in data and not (
        b"Content-Length" in data and not _complete(data)))
    data = re.sub(rb"\r\nDate: [^\r]*", b"", data)
    return re.sub(rb"Sec-WebSocket-Accept: [^\r]*", b"Sec-WebSocket-Accept: -", data)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"Content-Length: (\d+)", head)
    return length is not None and len(body) >= int(length.group(1))


def lane_then_flask(cycle: FlaskCycle, fetch: Callable[[], bytes]
                    ) -> tuple[bytes, bytes, int, int]:
    """``fetch``'s answer as the lane gives it, then with Flask forced; and how many
    Flask dispatches each made."""
    before = cycle.dispatched
    lane = fetch()
    lane_dispatches = cycle.dispatched - before
    with cycle.forced():
        flask = fetch()
    return lane, flask, lane_dispatches, cycle.dispatched - before - lane_dispatches


def both_ways(server: Any, cycle: FlaskCycle, query: str,
              headers: dict[str, str] | None = None) -> tuple[bytes, bytes]:
    lane, flask, _, forced = lane_then_flask(
        cycle, lambda: raw_upgrade(server.base_url, query, headers))
    assert forced == 1, "Flask did not answer the forced one"
    return lane, flask


def test_an_admitted_upgrade_skips_flask_and_works(own) -> None:  # noqa: F811
    server, cycle = own()
    client = WSClient(server.base_url, server.issue_token("alice"), compression=False)
    try:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": "n1"})
        assert client.recv_type("PONG")["payload"]["nonce"] == "n1"
    finally:
        client.close()
    assert cycle.dispatched == 0


def test_with_a_request_signal_receiver_flask_answers_the_same(own) -> None:  # noqa: F811
    server, cycle = own()
    with cycle.forced():
        client = WSClient(server.base_url, server.issue_token("alice"), compression=False)
        try:
            client.hello()
        finally:
            client.close()
    assert cycle.dispatched == 1


@pytest.mark.parametrize("case", ["no token", "bad token", "unknown session",
                                  "another user's session", "bad last_seq", "accepted",
                                  "an Origin", "gzip asked"])
def test_the_lane_answers_byte_for_byte_as_flask(own, case: str) -> None:  # noqa: F811
    server, cycle = own(enableCompression=True)
    token = server.issue_token("alice")
    owner = WSClient(server.base_url, token, compression=False)
    owner.hello()
    sid = owner.session_id
    queries = {"no token": "", "bad token": "token=nope",
               "unknown session": f"token={token}&session={'f' * 32}&last_seq=0",
               "another user's session":
                   f"token={server.issue_token('bob')}&session={sid}&last_seq=0",
               "bad last_seq": f"token={token}&session={sid}&last_seq=x1"}
    headers = {"an Origin": {"Origin": "http://page.example"},
               "gzip asked": {"Accept-Encoding": "gzip"}}.get(case, {})
    try:
        refused_before = dict(server.engine.stats.connections_refused)
        lane, flask = both_ways(server, cycle, queries.get(case, f"token={token}"), headers)
        assert lane == flask
        assert lane.startswith(b"HTTP/1.1 ")
        if case in queries:
            assert not lane.startswith(b"HTTP/1.1 101"), lane
            refused = server.engine.stats.connections_refused
            counted = sum(refused.values()) - sum(refused_before.values())
            assert counted in (0, 2), refused  # once per request (none: a bad last_seq)
        else:
            assert lane.startswith(b"HTTP/1.1 101"), lane
    finally:
        owner.close()


def raw_sse(base_url: str, query: str, headers: dict[str, str] | None = None) -> bytes:
    """The head of one SSE stream and its first event (or a refusal whole), with the Date,
    the session id and the chunk sizes around it made the same for every session."""
    sock = open_http(base_url, "GET", f"/proto/sse?{query}",
                     {"Accept": "text/event-stream", **(headers or {})})
    data = read_until(sock, lambda data: b"\r\n\r\n" in data and (
        b"event: session" in data and data.endswith(b"\n\n\r\n")
        or b"Content-Length" in data and _complete(data)))
    data = re.sub(rb"\r\nDate: [^\r]*", b"", data)
    return re.sub(rb"[0-9a-f]{32}", b"<session>", data)


@pytest.mark.parametrize("case", ["opened", "an Origin", "gzip asked", "no token",
                                  "bad token", "unknown session", "bad Last-Event-ID",
                                  "resumed by Last-Event-ID"])
def test_the_sse_lane_answers_as_flask(own, case: str) -> None:  # noqa: F811
    server, cycle = own(enableCompression=True)
    token = server.issue_token("alice")
    owner = WSClient(server.base_url, token, compression=False)
    owner.hello()
    owner.close()
    query = {"no token": "", "bad token": "token=nope",
             "unknown session": f"token={token}&session={'f' * 32}&last_seq=0"}.get(
                 case, f"token={token}")
    headers = {"an Origin": {"Origin": "http://page.example"},
               "gzip asked": {"Accept-Encoding": "gzip"},
               "bad Last-Event-ID": {"Last-Event-ID": "nonsense"},
               "resumed by Last-Event-ID": {"Last-Event-ID": f"{owner.session_id}:0"}}.get(
                   case, {})
    lane, flask, lane_dispatches, _ = lane_then_flask(
        cycle, lambda: raw_sse(server.base_url, query, headers))
    lane_took_it = lane_dispatches == 0
    assert lane == flask
    if case in ("opened", "an Origin", "gzip asked", "resumed by Last-Event-ID"):
        assert lane.startswith(b"HTTP/1.1 200") and b"event: session" in lane, lane
        assert lane_took_it  # no Flask dispatch on the lane
    else:
        assert lane.startswith(b"HTTP/1.1 4"), lane


def raw_stream(base_url: str, query: str, headers: dict[str, str]) -> bytes:
    """The head of one NDJSON stream opened with a HELLO body and its first line (or a
    refusal whole), the Date, session ids, timestamps and chunk sizes made comparable."""
    hello = (b'{"id":"c1","session":"","seq":"1","ts":"0","type":"HELLO","channel":"SYSTEM",'
             b'"payload":{"proto_version":"1.1.2","accept_major":[1],"accept_events":[]}}\n')
    sock = open_http(base_url, "POST", f"/proto/stream?{query}",
                     {"Content-Type": "application/x-ndjson", **headers}, hello)
    data = read_until(sock, lambda data: b"\r\n\r\n" in data and (
        b'"type":"HELLO"' in data and data.endswith(b"\n\r\n")
        or b"Content-Length" in data and _complete(data)))
    data = re.sub(rb"\r\nDate: [^\r]*", b"", data)
    data = re.sub(rb'"ts":"\d+"', b'"ts":"-"', data)
    data = re.sub(rb"\r\n[0-9a-f]+\r\n", b"\r\n<chunk>\r\n", data)
    return re.sub(rb"[0-9a-f]{32}", b"<session>", data)


@pytest.mark.parametrize("case", ["opened", "an Origin", "no token", "bad token",
                                  "unknown session", "bad last_seq"])
def test_the_stream_lane_answers_as_flask(own, case: str) -> None:  # noqa: F811
    server, cycle = own(enableCompression=True)
    token = server.issue_token("alice")
    query = {"unknown session": f"session={'f' * 32}&last_seq=0",
             "bad last_seq": f"session={'f' * 32}&last_seq=x"}.get(case, "")
    headers = {"Authorization": f"Bearer {token}"}
    headers.update({"an Origin": {"Origin": "http://page.example"},
                    "no token": {"Authorization": ""},
                    "bad token": {"Authorization": "Bearer nope"}}.get(case, {}))
    headers = {k: v for k, v in headers.items() if v}
    lane, flask, lane_dispatches, _ = lane_then_flask(
        cycle, lambda: raw_stream(server.base_url, query, headers))
    lane_took_it = lane_dispatches == 0
    assert lane == flask
    if case in ("opened", "an Origin"):
        assert lane.startswith(b"HTTP/1.1 200") and b'"type":"HELLO"' in lane, lane
        assert lane_took_it
    else:
        assert lane.startswith(b"HTTP/1.1 4"), lane
