"""transports/http.py's answer to a session POST (``answer_post``, and ``post_messages``,
its Flask response) and transports/request_body.py's ``read_body``, in this process: an
unstarted ProtoServer's engine, bodies from real gevent sockets where their pace matters.
(tests/web/test_post_answer.py runs the whole POST over the lane and Flask's route.)"""

from __future__ import annotations

import io
from typing import Any, Iterator

import gevent.socket
import orjson
import pytest
from werkzeug.wrappers import Request

from protoflask import ProtoServer
from protoflask.core.errors import MessageTooLarge, RequestTimeout
from protoflask.port import Ports
from protoflask.transports.http import PostAnswer, answer_post, post_messages
from protoflask.transports.request_body import read_body

from ..support import SECRET, Envelopes

LIMIT = 2048


@pytest.fixture(scope="module")
def server() -> Iterator[ProtoServer]:
    yield ProtoServer({"jwtSecret": SECRET, "maxMessageSize": LIMIT, "bodyTimeout": 200,
                       "maxConnectionsPerUser": 2, "enableLogging": False})


def environ_with(body: bytes | None = None, *, length: int | None = None,
                 stream: Any = None) -> dict[str, Any]:
    inp = stream if stream is not None else io.BytesIO(body or b"")
    size = length if length is not None else (len(body) if body is not None else None)
    return {"wsgi.input": inp, "CONTENT_LENGTH": "" if size is None else str(size),
            "REQUEST_METHOD": "POST", "PATH_INFO": "/proto/sse", "QUERY_STRING": "",
            "SERVER_NAME": "test", "SERVER_PORT": "80", "wsgi.url_scheme": "http"}


class Trickle:
    """A body that never arrives whole: a socket whose writer sends a few bytes and
    then nothing (held open)."""

    def __enter__(self) -> Any:
        self.reader, self.writer = gevent.socket.socketpair()
        self.writer.sendall(b'{"id"')
        return self.reader.makefile("rb")

    def __exit__(self, *exc: Any) -> None:
        self.reader.close()
        self.writer.close()


# -- read_body ------------------------------------------------------------------------


@pytest.mark.parametrize("declared", [True, False], ids=["Content-Length", "no length"])
def test_a_body_at_the_limit_is_read_and_one_byte_more_refused(declared: bool) -> None:
    body = b"x" * LIMIT
    at_limit, over = environ_with(body), environ_with(body + b"x")
    if not declared:  # (chunked: only reading finds the size)
        at_limit["CONTENT_LENGTH"] = over["CONTENT_LENGTH"] = ""
    assert read_body(at_limit, LIMIT) == body
    with pytest.raises(MessageTooLarge):
        read_body(over, LIMIT)


def test_a_body_that_does_not_arrive_in_time_is_a_request_timeout() -> None:
    with Trickle() as stream, pytest.raises(RequestTimeout):
        read_body(environ_with(stream=stream, length=100), LIMIT, timeout_ms=50)


# -- answer_post and post_messages ---------------------------------------------------


def test_the_answer_counts_the_messages_and_hands_them_to_the_session(
        server: ProtoServer) -> None:
    live = server.engine.new_session("u")
    envelopes = Envelopes()
    body = b"\n".join(orjson.dumps(envelopes.make("PING", "SYSTEM", {"nonce": f"n{i}"}))
                      for i in range(3))
    answer = answer_post(Ports(server.engine), {"session": live.id},
                         f"Bearer {server.issue_token('u')}", environ_with(body))
    assert answer == PostAnswer(202, {"accepted": 3})
    assert answer.encoded() == b'{"accepted":3}'
    assert live.core.up_seqs.highest == 3


def test_a_trickled_body_is_408_and_closes_the_connection(server: ProtoServer) -> None:
    live = server.engine.new_session("u")
    token = server.issue_token("u")
    with Trickle() as stream:
        environ = environ_with(stream=stream, length=100)
        environ["QUERY_STRING"] = f"session={live.id}"
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        response = post_messages(Ports(server.engine), Request(environ))
    assert response.status_code == 408
    assert response.headers["Connection"] == "close"
    assert orjson.loads(response.get_data())["error"]["code"] == "REQUEST_TIMEOUT"


def test_bodies_being_read_are_capped_per_user_and_given_back(server: ProtoServer) -> None:
    live = server.engine.new_session("v")
    authorization = f"Bearer {server.issue_token('v')}"
    for _ in range(2):  # maxConnectionsPerUser bodies being read at once
        server.engine.open_body("v")
    try:
        answer = answer_post(Ports(server.engine), {"session": live.id}, authorization,
                             environ_with(b"{}"))
        assert answer.status == 503 and answer.body["error"]["code"] == "USER_CONNECTION_LIMIT"
    finally:
        for _ in range(2):
            server.engine.close_body("v")
    # a body answered, whatever its answer, gives its place back
    for _ in range(3):
        assert answer_post(Ports(server.engine), {"session": live.id}, authorization,
                           environ_with(b"not json")).status == 400
    assert answer_post(Ports(server.engine), {"session": live.id}, authorization,
                       environ_with(b"[]")).status == 202
