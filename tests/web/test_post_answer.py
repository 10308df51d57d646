"""The session POST's answer in the web layer, in this process (no socket): protoflask's
own app answers it in front of Flask (post_lane.py) or through Flask's route and hooks
(web.py's blueprint). One test class runs over both paths with the same cases; the
byte-for-byte comparison on a real server is tests/integration/test_post_lane.py."""

from __future__ import annotations

import gzip
from typing import Any, Iterator

import orjson
import pytest
from werkzeug.test import EnvironBuilder

from protoflask import ProtoServer
from protoflask.live import LiveSession
from protoflask.post_lane import SessionPostLane

from ..support import SECRET, Envelopes

ORIGIN = "https://app.example"


class Answer:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = int(status.split()[0])
        self.headers = {name.lower(): value for name, value in headers}
        self.body = body

    def json(self) -> Any:
        body = self.body
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        return orjson.loads(body)


@pytest.fixture(scope="module")
def server() -> Iterator[ProtoServer]:
    """protoflask's own app, not started: the engine answers in the calling thread."""
    yield ProtoServer({"jwtSecret": SECRET, "maxMessageSize": 4096,
                       "allowedOrigins": [ORIGIN], "enableLogging": False})


@pytest.fixture(params=["lane", "flask"])
def path(request: pytest.FixtureRequest, server: ProtoServer) -> str:
    return str(request.param)


class TestSessionPost:
    """POST /proto/sse and /proto/stream: the same answer whichever path serves it."""

    @pytest.fixture(autouse=True)
    def _setup(self, server: ProtoServer, path: str) -> None:
        self.server = server
        self.path = path
        lane = server.app.wsgi_app
        assert isinstance(lane, SessionPostLane) and lane.app_is_plain()
        self.lane = lane
        self.dispatched = 0
        self.token = server.issue_token("alice")
        self.live: LiveSession = server.engine.new_session("alice")
        self.envelopes = Envelopes()

    def post(self, body: bytes, *, query: str | None = None, token: str | None = "",
             headers: dict[str, str] | None = None, url: str = "/proto/sse") -> Answer:
        token = self.token if token == "" else token
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        environ = EnvironBuilder(
            method="POST", path=url, headers=all_headers, data=body,
            query_string=f"session={self.live.id}" if query is None else query).get_environ()
        app = self.server.app
        dispatch = app.full_dispatch_request
        self.dispatched = 0

        def counted() -> Any:
            self.dispatched += 1
            return dispatch()

        app.full_dispatch_request = counted  # type: ignore[method-assign]
        answered: list[Any] = []
        try:
            wsgi = self.lane if self.path == "lane" else self.lane.flask_wsgi_app
            chunks = wsgi(environ, lambda status, headers, exc_info=None: answered.extend(
                [status, headers]))
            body_out = b"".join(chunks)
            getattr(chunks, "close", lambda: None)()
        finally:
            del app.full_dispatch_request
        # the lane answered it itself, or Flask did
        assert self.dispatched == (0 if self.path == "lane" else 1)
        return Answer(answered[0], answered[1], body_out)

    def lines(self, *messages: dict[str, Any]) -> bytes:
        return b"\n".join(orjson.dumps(m) for m in messages)

    def downstream(self) -> list[dict[str, Any]]:
        """What the session sent its client (no transport: it is all in the window)."""
        return [orjson.loads(stored.data) for stored in self.live.core.replay]

    def test_messages_are_accepted_and_handled(self) -> None:
        hello = self.envelopes.make("HELLO", "SYSTEM", {
            "proto_version": "1.1.2", "accept_major": [1], "accept_events": [],
            "capabilities": {}})
        ping = self.envelopes.make("PING", "SYSTEM", {"nonce": "n1"})
        answer = self.post(self.lines(hello, ping))
        assert answer.status == 202 and answer.json() == {"accepted": 2}
        assert answer.headers["content-type"] == "application/json"
        pings = [self.envelopes.make("PING", "SYSTEM", {"nonce": f"s{n}"}) for n in range(3)]
        answer = self.post(self.lines(*pings), url="/proto/stream")
        assert answer.status == 202 and answer.json() == {"accepted": 3}
        assert [(m["type"], m["payload"].get("nonce")) for m in self.downstream()] == [
            ("HELLO", None), ("PONG", "n1"), ("PONG", "s0"), ("PONG", "s1"), ("PONG", "s2")]

    def test_no_token_is_401(self) -> None:
        answer = self.post(b"{}", token=None)
        assert answer.status == 401 and answer.json()["error"]["code"] == "MISSING_TOKEN"

    def test_a_bad_token_is_401(self) -> None:
        answer = self.post(b"{}", token="not.a.token")
        assert answer.status == 401 and answer.json()["error"]["code"] == "INVALID_TOKEN"

    def test_another_users_session_is_not_found(self) -> None:
        answer = self.post(b"{}", token=self.server.issue_token("mallory"))
        assert answer.status == 404 and answer.json()["error"]["code"] == "SESSION_NOT_FOUND"

    def test_a_body_that_is_not_json_is_400_and_reported_downstream(self) -> None:
        answer = self.post(b"\xff not json")
        assert answer.status == 400 and answer.json()["error"]["code"] == "INVALID_MESSAGE"
        assert [m["payload"]["code"] for m in self.downstream()
                if m["type"] == "ERROR"] == ["INVALID_MESSAGE"]

    def test_a_body_over_max_message_size_is_413_and_reported_downstream(self) -> None:
        big = self.envelopes.make("PING", "SYSTEM", {"nonce": "x" * 5000})
        answer = self.post(orjson.dumps(big))
        assert answer.status == 413 and answer.json()["error"]["code"] == "MESSAGE_TOO_LARGE"
        assert [m["payload"]["code"] for m in self.downstream()
                if m["type"] == "ERROR"] == ["MESSAGE_TOO_LARGE"]

    def test_an_allowed_origin_gets_cors_and_gzip_when_asked(self) -> None:
        ping = self.envelopes.make("PING", "SYSTEM", {"nonce": "n" * 200})
        answer = self.post(orjson.dumps(ping), headers={"Origin": ORIGIN,
                                                        "Accept-Encoding": "gzip"})
        assert answer.status == 202 and answer.json() == {"accepted": 1}
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        assert int(answer.headers["content-length"]) == len(answer.body)


def test_the_lane_steps_aside_for_what_it_does_not_answer(server: ProtoServer) -> None:
    """No session, a resume, a refused Origin: Flask's route answers (the lane's own
    checks, in this process)."""
    lane = server.app.wsgi_app
    assert isinstance(lane, SessionPostLane)
    token = server.issue_token("alice")
    for query, origin, status in (("", None, 400), ("session=x&last_seq=3", None, 404),
                                  ("session=x", "https://evil.example", 403)):
        headers = {"Authorization": f"Bearer {token}"}
        if origin:
            headers["Origin"] = origin
        environ = EnvironBuilder(method="POST", path="/proto/sse", query_string=query,
                                 headers=headers, data=b"{}").get_environ()
        seen: list[str] = []
        body = b"".join(lane(environ, lambda s, h, e=None, seen=seen: seen.append(s)))
        assert int(seen[0].split()[0]) == status, (query, body)
