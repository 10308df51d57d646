"""The session POSTs of protoflask's own app skip Flask's request cycle (post_lane.py):
the answer on the wire is byte for byte what Flask's route and hooks answer, the lane is
really taken, and it steps aside whenever an application could see the difference."""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterator

import orjson
import pytest
from flask import Flask, request_started
from hypothesis import given, strategies as st
from werkzeug.wrappers import Request

from protoflask.post_lane import SessionPostLane, plain_query

from ..support import Envelopes, SSEClient, StreamClient, open_http, read_until


def raw_answer(base_url: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """The whole response to one POST, as it came off the socket, minus the Date header
    (the WSGI server's, and it moves with the clock)."""
    sock = open_http(base_url, "POST", path, {"Connection": "close", **headers}, body)
    return re.sub(rb"\r\nDate: [^\r]*", b"", read_until(sock))


class FlaskCycle:
    """Counts the requests that went through Flask's dispatch, and can send every request
    there (a receiver of ``request_started``: the lane steps aside for it)."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.dispatched = 0
        dispatch = app.full_dispatch_request

        def counted() -> Any:
            self.dispatched += 1
            return dispatch()

        app.full_dispatch_request = counted  # type: ignore[method-assign]

    def forced(self) -> Any:
        cycle = self

        class Forced:
            def __enter__(self) -> None:
                request_started.connect(cycle._noop, cycle.app)

            def __exit__(self, *exc: Any) -> None:
                request_started.disconnect(cycle._noop)

        return Forced()

    @staticmethod
    def _noop(sender: Any, **extra: Any) -> None:
        pass


@pytest.fixture
def own(make_server: Callable[..., Any]) -> Iterator[Callable[..., tuple[Any, FlaskCycle]]]:
    def make(**config: Any) -> tuple[Any, FlaskCycle]:
        server = make_server(**config)
        assert isinstance(server.app.wsgi_app, SessionPostLane)
        return server, FlaskCycle(server.app)

    yield make


def pings(env: Envelopes, session: str, n: int) -> bytes:
    return b"\n".join(orjson.dumps(env.make("PING", "SYSTEM", {"nonce": f"n{i}"},
                                             session=session)) for i in range(n)) + b"\n"


def both_ways(base_url: str, cycle: FlaskCycle, path: str, headers: dict[str, str],
              body: Callable[[], bytes]) -> tuple[bytes, bytes]:
    """The same request answered by the lane, then by Flask; each took the way asked."""
    before = cycle.dispatched
    lane = raw_answer(base_url, path, headers, body())
    assert cycle.dispatched == before, "the lane was not taken"
    with cycle.forced():
        flask = raw_answer(base_url, path, headers, body())
    assert cycle.dispatched == before + 1, "Flask did not answer the forced request"
    return lane, flask


CASES = {
    "accepted": ({}, "ok"),
    "accepted, an Origin": ({"Origin": "http://page.example"}, "ok"),
    "accepted, gzip asked": ({"Accept-Encoding": "gzip"}, "ok"),
    "unknown session": ({}, "unknown"),
    "unknown session, gzip asked (the error body is gzipped)":
        ({"Accept-Encoding": "gzip", "Origin": "http://page.example"}, "unknown"),
    "bad token": ({"Authorization": "Bearer nope"}, "ok"),
    "no token": ({"Authorization": ""}, "ok"),
    "not JSON": ({}, "junk"),
    "too large": ({}, "large"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("transport", ["sse", "stream"])
def test_the_lane_answers_byte_for_byte_as_flask(own, case, transport):
    server, cycle = own(maxMessageSize=4096, enableCompression=True)
    token = server.issue_token("alice")
    client = (SSEClient if transport == "sse" else StreamClient)(server.base_url, token)
    try:
        client.hello()
        extra, kind = CASES[case]
        session = "f" * 32 if kind == "unknown" else client.session_id
        headers = {"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {token}",
                   **extra}
        headers = {k: v for k, v in headers.items() if v}
        env = Envelopes(start=100)

        def body() -> bytes:
            if kind == "junk":
                return b"this is not JSON"
            if kind == "large":
                return b"[" + b" " * 5000 + b"]"
            return pings(env, client.session_id, 3)

        lane, flask = both_ways(server.base_url, cycle, f"/proto/{transport}?session={session}",
                                headers, body)
        assert lane == flask
        assert lane.startswith(b"HTTP/1.1 ")
        if kind == "ok" and "Authorization" in headers and "nope" not in headers["Authorization"]:
            assert lane.startswith(b"HTTP/1.1 202 ") and lane.endswith(b'{"accepted":3}')
            for _ in range(6):  # both batches arrived downstream
                client.recv_type("PONG")
    finally:
        client.close()


def test_cors_off_and_a_listed_origin_answer_the_same(own):
    for config, origin in (({"enableCORS": False}, "http://page.example"),
                           ({"allowedOrigins": ["https://app.example"]}, "https://app.example")):
        server, cycle = own(**config)
        token = server.issue_token("alice")
        with SSEClient(server.base_url, token) as client:
            client.hello()
            env = Envelopes(start=100)
            lane, flask = both_ways(
                server.base_url, cycle, f"/proto/sse?session={client.session_id}",
                {"Authorization": f"Bearer {token}", "Origin": origin},
                lambda env=env, sid=client.session_id: pings(env, sid, 2))
            assert lane == flask and b" 202 " in lane.split(b"\r\n")[0]
            assert (b"Access-Control-Allow-Origin" in lane) == config.get("enableCORS", True)


def test_the_lane_steps_aside_when_it_is_not_the_common_case(own):
    server, cycle = own(allowedOrigins=["https://app.example"])
    token = server.issue_token("alice")
    with SSEClient(server.base_url, token) as client:
        client.hello()
        sid = client.session_id
        env = Envelopes(start=100)
        auth = {"Authorization": f"Bearer {token}"}
        for path, headers, status in (
                (f"/proto/sse?session={sid}", {**auth, "Origin": "https://evil.example"}, 403),
                (f"/proto/sse?session=%66{sid[2:]}&x=1", auth, 404),  # needs decoding
                ("/proto/sse", auth, 400),  # no session
                (f"/proto/sse?token={token}&session={sid}", {}, 202),  # a token in the query
        ):
            before = cycle.dispatched
            answer = raw_answer(server.base_url, path, headers, pings(env, sid, 1))
            assert answer.split(b"\r\n")[0].split()[1] == str(status).encode(), answer
            took_flask = cycle.dispatched == before + 1
            assert took_flask == (status != 202), (path, headers)


def test_an_application_hook_on_the_own_app_sees_every_session_post(own):
    server, cycle = own()
    seen: list[str] = []

    @server.app.before_request
    def note() -> None:
        from flask import request
        seen.append(request.path)

    token = server.issue_token("alice")
    with SSEClient(server.base_url, token) as client:
        client.hello()
        before = cycle.dispatched
        client.post(pings(Envelopes(start=100), client.session_id, 2))
        client.recv_type("PONG")
    assert cycle.dispatched > before
    assert "/proto/sse" in seen


def test_an_application_app_never_gets_the_lane(make_server):
    app = Flask("application")
    make_server(app=app)
    assert not isinstance(app.wsgi_app, SessionPostLane)


def test_the_access_line_is_flasks(own, caplog):
    server, cycle = own(enableLogging=True)
    token = server.issue_token("alice")
    with SSEClient(server.base_url, token) as client:
        client.hello()
        env = Envelopes(start=100)
        with caplog.at_level(logging.INFO, logger="protoflask.access"):
            both_ways(server.base_url, cycle, f"/proto/sse?session={client.session_id}&token=x",
                      {"Authorization": f"Bearer {token}"},
                      lambda: pings(env, client.session_id, 1))
    lines = [re.sub(r"[0-9.]+ms$", "Nms", r.getMessage()) for r in caplog.records
             if r.name == "protoflask.access" and r.getMessage().startswith("POST")]
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert "token=[redacted]" in lines[0]


_QUERY_TEXT = st.text(alphabet="ab=&.-_~0123456789xyz", max_size=30)


@given(_QUERY_TEXT)
def test_plain_query_reads_what_flask_reads(query):
    parsed = plain_query(query)
    assert parsed is not None
    args = Request({"QUERY_STRING": query, "REQUEST_METHOD": "POST", "SERVER_NAME": "x",
                    "SERVER_PORT": "80", "wsgi.url_scheme": "http"}).args
    assert parsed == {key: args.get(key) for key in args}


@pytest.mark.parametrize("query", ["a=%41", "a=b+c", "a=é"])
def test_plain_query_leaves_escapes_to_flask(query):
    assert plain_query(query) is None
