"""protoflask/head_lane.py's reading of a request head against gunicorn's parser: every head
the lane reads, gunicorn reads the same (method, target, headers, body, keep-alive) and
builds the same WSGI environ from; every head gunicorn refuses, the lane leaves to it.
(The answers byte for byte: tests/integration/test_head_lane.py.)"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser
from hypothesis import given, settings, strategies as st

from protoflask.transports.stream import CARRIED_BODY
from protoflask.head_lane import (HeadLane, HeadLimits, HeadRequest, environ_for,
                                  handshake_of, parse_head, set_base_environ,
                                  upgrade_environ)

PEER = ("127.0.0.1", 50123)
SERVER = ("127.0.0.1", 8080)
KEY = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
UPGRADE = ("GET /proto/websocket?token=abc.def.ghi HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
           "Upgrade: websocket\r\nConnection: Upgrade\r\n" + KEY + "\r\n")
HELLO = b'{"type":"HELLO"}\n'


def cfg(**settings_: Any) -> Config:
    config = Config()
    for name, value in settings_.items():
        config.set(name, value)
    return config


def gunicorn_reads(data: bytes, config: Config) -> Any:
    """gunicorn's Request for ``data`` (the whole connection's bytes), or the error."""
    try:
        return next(RequestParser(config, iter([data]), PEER))
    except Exception as exc:  # what gunicorn answers 4xx for
        return exc


def assert_read_alike(data: bytes, config: Config | None = None) -> HeadRequest | None:
    """The lane's reading of ``data``; when it reads it, gunicorn's is the same."""
    config = config or Config()
    head = parse_head(data, HeadLimits.of(config))
    if head is None:
        return None
    theirs = gunicorn_reads(data, config)
    assert not isinstance(theirs, Exception), (data, theirs)
    for field in ("method", "uri", "path", "query", "fragment", "version", "headers",
                  "scheme", "_expected_100_continue", "proxy_protocol_info"):
        assert getattr(head, field) == getattr(theirs, field), field
    assert head.should_close() == theirs.should_close()
    if head.body is not None:
        assert head.body.read() == theirs.body.read()
    else:
        assert theirs.body.read() == b""
    assert theirs.unreader.read() == b"", "bytes after the request: gunicorn has more"
    set_base_environ(config)
    _, environ = wsgi.create(theirs, "sock", PEER, SERVER, config)
    environ["wsgi.multithread"] = True  # gunicorn's async worker sets it after create()
    ours = environ_for(head, "sock", PEER, SERVER)
    left_out = {"wsgi.errors", "wsgi.input", "wsgi.early_hints"}
    assert set(ours) == set(environ) - left_out
    assert ours == {k: v for k, v in environ.items() if k not in left_out}
    if head.is_upgrade:
        assert_upgrade_alike(head, environ)
    return head


def served_handshake(environ: dict[str, Any]) -> list[tuple[str, Any]]:
    """What ``web.serve_apart`` filters out of a whole environ for the handshake."""
    return [(k, v) for k, v in environ.items()
            if k.startswith("HTTP_") or k in ("PATH_INFO", "QUERY_STRING")]


def assert_upgrade_alike(head: HeadRequest, environ: dict[str, Any]) -> None:
    """The lean upgrade's handshake (``handshake_of``) is what ``serve_apart`` filters out
    of gunicorn's environ, its headers in their order; its environ (``upgrade_environ``)
    has gunicorn's value for each of its keys."""
    handshake = handshake_of(head)
    served = served_handshake(environ)
    assert handshake == dict(served)
    assert [k for k in handshake if k.startswith("HTTP_")] \
        == [k for k, _ in served if k.startswith("HTTP_")]
    lean = upgrade_environ(handshake, head, "sock")
    assert lean == {k: environ[k] for k in lean}
    assert {"gunicorn.socket", "REQUEST_METHOD", "QUERY_STRING"} <= set(lean)


READ = {
    "upgrade": UPGRADE,
    "upgrade, no query": UPGRADE.replace("?token=abc.def.ghi", ""),
    "upgrade, an Origin and a Bearer token":
        UPGRADE[:-2] + "Origin: http://page.example\r\nAuthorization: Bearer x.y.z\r\n\r\n",
    "upgrade, spaces around a value": UPGRADE.replace("Upgrade: websocket",
                                                      "Upgrade:  websocket  "),
    "upgrade, no space after the colon": UPGRADE.replace("Connection: ", "Connection:"),
    "upgrade, a tab in a value": UPGRADE.replace("Upgrade: websocket", "Upgrade: web\tsocket"),
    "upgrade, tabs and blanks around values": UPGRADE.replace(
        "Upgrade: websocket", "Upgrade:\t websocket \t").replace("Connection: Upgrade",
                                                                 "Connection: Upgrade\t"),
    "sse": "GET /proto/sse?token=t HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\n\r\n",
    "sse, Last-Event-ID": "GET /proto/sse?token=t HTTP/1.1\r\nHost: h\r\n"
                          "Last-Event-ID: abc:3\r\n\r\n",
    "sse, Connection: close": "GET /proto/sse HTTP/1.1\r\nConnection: close\r\n\r\n",
    "sse, an escaped query": "GET /proto/sse?token=a%20b&x=1+2 HTTP/1.1\r\nHost: h\r\n\r\n",
    "stream": "POST /proto/stream HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer t\r\n"
              "Content-Type: application/x-ndjson\r\nContent-Length: 17\r\n\r\n"
              + HELLO.decode(),
    "stream, an empty body": "POST /proto/stream HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "stream resumed": "POST /proto/stream?session=abc&last_seq=3 HTTP/1.1\r\n"
                      "Content-Length: 17\r\n\r\n" + HELLO.decode(),
}

LEFT = {  # the lane leaves these to gunicorn (which may well serve them)
    "another path": UPGRADE.replace("/proto/websocket", "/proto/websocketx"),
    "a path with an escape": UPGRADE.replace("/proto/websocket", "/proto/web%73ocket"),
    "POST to the WebSocket": UPGRADE.replace("GET", "POST", 1),
    "a fragment": UPGRADE.replace("ghi ", "ghi#x "),
    "HTTP/1.0": UPGRADE.replace("HTTP/1.1", "HTTP/1.0", 1),
    "not whole": UPGRADE[:-2],
    "pipelined": UPGRADE + UPGRADE,
    "bytes after": UPGRADE + "\x81",
    "a body on a GET": UPGRADE[:-2] + "Content-Length: 2\r\n\r\nhi",
    "a header with _": UPGRADE[:-2] + "X_Forwarded_For: 1.2.3.4\r\n\r\n",
    "a repeated header": UPGRADE[:-2] + "Origin: a\r\nOrigin: b\r\n\r\n",
    "a repeated Host": UPGRADE[:-2] + "Host: other\r\n\r\n",
    "Expect": UPGRADE[:-2] + "Expect: 100-continue\r\n\r\n",
    "Transfer-Encoding": "POST /proto/stream HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "0\r\n\r\n",
    "a forwarded scheme": UPGRADE[:-2] + "X-Forwarded-Proto: https\r\n\r\n",
    "obsolete folding": UPGRADE[:-2] + "X-A: a\r\n b\r\n\r\n",
    "a bare LF": UPGRADE.replace("Upgrade: websocket\r\n", "Upgrade: websocket\n"),
    "a control byte": UPGRADE.replace("Upgrade: websocket", "Upgrade: web\x01socket"),
    "non-ASCII": UPGRADE.replace("Upgrade: websocket", "Upgrade: w\xe9bsocket"),
    "a space before the colon": UPGRADE.replace("Upgrade: ", "Upgrade : "),
    "no colon": UPGRADE[:-2] + "Nonsense\r\n\r\n",
    "two spaces in the request line": UPGRADE.replace(" HTTP/1.1", "  HTTP/1.1", 1),
    "a body shorter than its length": "POST /proto/stream HTTP/1.1\r\nContent-Length: 30\r\n"
                                      "\r\n" + HELLO.decode(),
    "a body longer than its length": "POST /proto/stream HTTP/1.1\r\nContent-Length: 3\r\n"
                                     "\r\n" + HELLO.decode(),
    "a stream without a length": "POST /proto/stream HTTP/1.1\r\nHost: h\r\n\r\n",
    "a signed length": "POST /proto/stream HTTP/1.1\r\nContent-Length: +17\r\n\r\n"
                       + HELLO.decode(),
    "a body over the lane's": "POST /proto/stream HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"
                              + "x" * 5000,
    "a leading empty line": "\r\n" + UPGRADE,
    "a lowercase method": UPGRADE.replace("GET", "get", 1),
}


@pytest.mark.parametrize("case", sorted(READ))
def test_a_head_the_lane_reads_gunicorn_reads_the_same(case: str) -> None:
    assert assert_read_alike(READ[case].encode("latin-1")) is not None


@pytest.mark.parametrize("case", sorted(LEFT))
def test_the_lane_leaves_the_rest_to_gunicorn(case: str) -> None:
    assert assert_read_alike(LEFT[case].encode("latin-1")) is None


def test_the_limits_are_gunicorns() -> None:
    """A head over gunicorn's configured limits is left to it (414, 431 and 400 answered
    there); one just under them is read alike."""
    long_target = UPGRADE.replace("abc.def.ghi", "t" * 200)
    line = len(long_target.split("\r\n")[0])
    assert assert_read_alike(long_target.encode(), cfg(limit_request_line=line + 1))
    assert assert_read_alike(long_target.encode(), cfg(limit_request_line=line)) is None
    assert isinstance(gunicorn_reads(long_target.encode(), cfg(limit_request_line=line - 1)),
                      Exception)
    field = "X-Long: " + "v" * 100
    head = (UPGRADE[:-2] + field + "\r\n\r\n").encode()
    assert assert_read_alike(head, cfg(limit_request_field_size=len(field) + 2))
    assert assert_read_alike(head, cfg(limit_request_field_size=len(field) + 1)) is None
    assert assert_read_alike(head, cfg(limit_request_fields=6))  # 5 fields + X-Long
    assert assert_read_alike(head, cfg(limit_request_fields=5)) is None
    assert isinstance(gunicorn_reads(head, cfg(limit_request_fields=5)), Exception)
    one = "Host: " + "h" * 100  # a head of one field: the field's limit at the head's length
    head = f"GET /proto/sse HTTP/1.1\r\n{one}\r\n\r\n".encode()
    assert assert_read_alike(head, cfg(limit_request_field_size=len(one) + 2))
    assert assert_read_alike(head, cfg(limit_request_field_size=len(one) + 1)) is None


# -- the same, over generated heads ---------------------------------------------------------

_name = st.one_of(
    st.sampled_from(["Host", "Origin", "Upgrade", "Connection", "X-A", "x-a", "Authorization",
                     "Content-Length", "Sec-WebSocket-Key", "Content-Type", "Last-Event-ID"]),
    st.sampled_from(["X_A", "Transfer-Encoding", "Expect", "X-Forwarded-Proto", "", " X",
                     "X ", "A@B", "Script_Name", "TE"]))
# half of the values, separators, versions and endings well formed, so that the lane reads
# a good share of the heads
_value = st.one_of(st.sampled_from(["a", "ab 1", " x-y ", "", "1"]),
                   st.text(alphabet=st.sampled_from(list("ab 1-=/:.\t\x00\x7f\r\n\xe9")),
                           max_size=8))
_separator = st.one_of(st.just(": "), st.sampled_from([":", ": ", " :", ""]))
_line = st.tuples(_name, _separator, _value).map("".join)
_start = st.one_of(st.sampled_from(["GET /proto/websocket?token=a", "GET /proto/sse"]),
                   st.sampled_from(["GET /proto/websocket", "POST /proto/stream",
                                    "GET /proto/websocket?a=%41&b", "GET /health",
                                    "POST /proto/stream?session=s", "GET /proto/sse#x",
                                    "PUT /proto/stream", "GET  /proto/sse",
                                    "GET /proto/sse?\x7f"]))
_version = st.one_of(st.just(" HTTP/1.1"),
                    st.sampled_from([" HTTP/1.1", " HTTP/1.0", " HTTP/2.0", " http/1.1", ""]))
_ending = st.one_of(st.just("\r\n\r\n"), st.sampled_from(
    ["\r\n\r\n", "\r\n\r\nx", "\n\n", "\r\n", "\r\n\r\n" + "{}\n"]))


@settings(max_examples=400, deadline=None)
@given(start=_start, version=_version, ending=_ending, lines=st.lists(
    _line, max_size=5, unique_by=lambda line: line.partition(":")[0].strip().upper()))
def test_generated_heads_are_read_alike_or_left(start: str, version: str, lines: list[str],
                                                 ending: str) -> None:
    data = "\r\n".join([start + version, *lines]) + ending
    assert_read_alike(data.encode("utf-8"))


# -- the response writer ----------------------------------------------------------------------


class Wire:
    """A socket that keeps what is written to it, one entry per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def send(self, data: bytes) -> int:  # a socket's own send (sockets.immediate_send)
        self.sendall(data)
        return len(data)


def written(response_class: Any, head: HeadRequest, status: str,
            headers: list[tuple[str, str]], chunks: list[bytes]) -> list[bytes]:
    wire = Wire()
    resp = response_class(head, wire, Config())
    resp.start_response(status, headers)
    for chunk in chunks:
        resp.write(chunk)
    resp.close()
    return wire.writes


RESPONSES = {
    "a stream's first event": ("200 OK", [("Content-Type", "text/event-stream")],
                               [b"event: session\n\n", b"data: 1\n\n"]),
    "an empty chunk first": ("200 OK", [("Content-Type", "application/x-ndjson")],
                             [b"", b"{}\n"]),
    "nothing written": ("200 OK", [("X-A", "1")], []),
    "a length": ("401 UNAUTHORIZED", [("Content-Length", "2")], [b"{}"]),
    "a 204": ("204 NO CONTENT", [("Content-Length", "0")], [b""]),
}


RESPONSES.update({
    "a length, written past": ("200 OK", [("Content-Length", "3")], [b"ab", b"cd", b"e"]),
    "a length, empty writes": ("200 OK", [("Content-Length", "2")], [b"", b"ab", b""]),
    "a 304 with a body": ("304 NOT MODIFIED", [("X-A", "1")], [b"dropped"]),
    "a 101": ("101 SWITCHING PROTOCOLS", [("Connection", "Upgrade"),
                                          ("Upgrade", "websocket")], []),
    "a chunk of 26 bytes": ("200 OK", [("X-A", "1")], [b"abcdefghijklmnopqrstuvwxyz"]),
    "a stream's head": ("200 OK", [("Content-Type", "application/x-ndjson"),
                                   ("Cache-Control", "no-cache"), ("Proto-Session", "s1"),
                                   ("X-Padded", " v\t")], [b'{"type":"HELLO"}\n']),
})


@pytest.mark.parametrize("lean", [True, False], ids=["LeanResponse", "LaneResponse"])
@pytest.mark.parametrize("remember", [True, False])
@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("connection", ["", "close", "keep-alive"])
@pytest.mark.parametrize("case", sorted(RESPONSES))
def test_the_lane_writes_the_bytes_gunicorns_writer_writes(case: str, connection: str,
                                                           version: str,
                                                           remember: bool,
                                                           lean: bool) -> None:
    """Both of the swap point ``HeadLane.lean_response``: ``LaneResponse`` is gunicorn's
    ``Response`` with the head held for the first body bytes and the Date made once a
    second, ``LeanResponse`` the same without gunicorn's ``Response``: the same bytes,
    in no more writes, and what gunicorn's access log reads of it the same; its
    ``is_chunked`` with the protocol setting read once (``remember_settings``) or not.
    (An HTTP/1.0 head is gunicorn's to read: its request is made as one here.)"""
    from protoflask.head_lane import LaneResponse, LeanResponse

    writer = LeanResponse if lean else LaneResponse

    data = ("GET /proto/sse HTTP/1.1\r\nHost: h\r\n"
            + (f"Connection: {connection}\r\n" if connection else "") + "\r\n").encode()
    old = LaneResponse.remember_settings
    LaneResponse.remember_settings = remember
    try:
        for _ in range(3):  # the two in the same second
            head = parse_head(data, HeadLimits.of(Config()))
            assert head is not None
            if version == "1.0":
                head.version = (1, 0)
            theirs = written(wsgi.Response, head, *RESPONSES[case])
            ours = written(writer, head, *RESPONSES[case])
            if b"".join(ours) == b"".join(theirs):
                break
    finally:
        LaneResponse.remember_settings = old
    assert b"".join(ours) == b"".join(theirs)
    assert len(ours) <= len(theirs)
    if RESPONSES[case][2][:1] == [b"event: session\n\n"]:
        assert len(ours) == len(theirs) - 1  # the head went with the first event
    # what gunicorn's access log and worker read of the writer once it is done
    seen = []
    for response_class in (wsgi.Response, writer):
        resp = response_class(head, Wire(), Config())
        resp.start_response(*RESPONSES[case][:2])
        for chunk in RESPONSES[case][2]:
            resp.write(chunk)
        resp.close()
        seen.append((resp.status, resp.status_code, resp.headers, resp.sent,
                     resp.response_length, resp.chunked, resp.headers_sent,
                     resp.should_close()))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("lean", [True, False], ids=["LeanResponse", "LaneResponse"])
def test_a_second_start_with_exc_info_writes_what_gunicorn_writes(lean: bool) -> None:
    """start_response again with exc_info before the head is sent: gunicorn's writer
    takes the new status and adds the new headers to the first's; both lane writers
    write the same bytes."""
    from protoflask.head_lane import LaneResponse, LeanResponse

    head = parse_head(b"GET /proto/sse HTTP/1.1\r\nHost: h\r\n\r\n", HeadLimits.of(Config()))
    writes = []
    for response_class in (wsgi.Response, LeanResponse if lean else LaneResponse):
        wire = Wire()
        resp = response_class(head, wire, Config())
        resp.start_response("200 OK", [("X-First", "1"), ("Content-Type", "text/plain")])
        try:
            raise RuntimeError("late")
        except RuntimeError:
            resp.start_response("500 INTERNAL SERVER ERROR", [("X-Second", "2")],
                                sys.exc_info())
        resp.write(b"oops")
        resp.close()
        writes.append(re.sub(rb"\r\nDate: [^\r]*", b"", b"".join(wire.writes)))
    assert writes[0] == writes[1]


HEADER_LISTS = [
    [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache"),
     ("X-Accel-Buffering", "no"), ("Proto-Session", "0123456789abcdef"), ("Vary", "Origin"),
     ("Access-Control-Allow-Origin", "*")],
    [("Content-Length", "2"), ("Connection", "close"), ("X-A", " padded\t")],
    [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Keep-Alive", "5"), ("Date", "x")],
    [("Transfer-Encoding", "chunked"), ("Server", "x"), ("TE", "trailers"), ("X-B", "")],
    [("X-A", "1"), ("Bad Name", "1")],
    [("X-A", "1"), ("X-C", "a\r\nInjected: 1")],
    [("X-A", "1"), (b"X-Bytes", "1")],
    [("X-A", "1"), ("X-D", 5)],
    [["X-List", "1"], ("X-A", "1")],
    # names passed before (X-A, Vary, Proto-Session), with values gunicorn refuses or strips
    [("Vary", "Origin"), ("X-A", "a\r\nInjected: 1")],
    [("X-A", " padded\t"), ("Proto-Session", "x\x00y")],
    [("Proto-Session", "s"), ("X-A", 5)],
    [("X-A", "1"), ("x-a", "2"), ("Content-Type", "a\x7f")],
    [("X-A", "1"), (["X-A"], "1")],
    [("X-A", "1"), (("X", "A"), "1")],
]


@pytest.mark.parametrize("headers", HEADER_LISTS, ids=range(len(HEADER_LISTS)))
def test_remembered_headers_are_processed_as_gunicorn_processes_them(headers: Any) -> None:
    """``LaneResponse.process_headers`` (a pair gunicorn passed before appended at once):
    the same headers, length, upgrade and refusals as gunicorn's, the first time and
    from memory; ``LeanResponse.process_headers`` (a name passed before: its value
    checked alone) the same."""
    from protoflask.head_lane import LaneResponse, LeanResponse

    head = parse_head(b"GET /proto/sse HTTP/1.1\r\nHost: h\r\n\r\n", HeadLimits.of(Config()))

    def processed(response_class: Any, remember: bool = True) -> tuple[Any, ...]:
        resp = response_class(head, Wire(), Config())
        resp.remember_headers = remember
        try:
            resp.process_headers(list(headers))
            error = None
        except Exception as exc:  # noqa: BLE001 (the same refusal, compared)
            error = (type(exc), str(exc))
        return resp.headers, resp.response_length, resp.upgrade, error

    theirs = processed(wsgi.Response)
    assert processed(LaneResponse, remember=False) == theirs
    for _ in range(3):
        assert processed(LaneResponse) == theirs
        assert processed(LeanResponse) == theirs  # (names remembered after the first)


@pytest.mark.parametrize("size", [10, 4 << 20], ids=["small", "over the buffer"])
def test_a_write_at_once_puts_the_bytes_gunicorns_writer_puts(size: int) -> None:
    """``LaneResponse.send_at_once`` (the descriptor's send, the rest through sendall) on
    a real gevent socket: the bytes gunicorn's writer puts on it, however much the kernel
    takes at once."""
    import gevent
    import gevent.socket

    from protoflask.head_lane import LaneResponse, LeanResponse

    head = parse_head(b"GET /proto/sse HTTP/1.1\r\nHost: h\r\n\r\n", HeadLimits.of(Config()))
    chunks = [b"event: session\n\n", bytes(range(256)) * (size // 256 + 1), b"x"]

    def received(response_class: Any, at_once: bool) -> bytes:
        near, far = gevent.socket.socketpair()
        far.settimeout(10)
        try:
            resp = response_class(head, near, Config())
            resp.send_at_once = at_once
            resp.start_response("200 OK", [("Content-Type", "text/event-stream")])
            reader = gevent.spawn(lambda: b"".join(iter(lambda: far.recv(65536), b"")))
            for chunk in chunks:
                resp.write(chunk)
            resp.close()
            near.close()
            data: bytes = reader.get(timeout=10)
        finally:
            near.close()
            far.close()
        return re.sub(rb"\r\nDate: [^\r]*", b"", data)

    theirs = received(wsgi.Response, False)
    assert received(LaneResponse, True) == theirs
    assert received(LaneResponse, False) == theirs
    assert received(LeanResponse, True) == theirs
    assert received(LeanResponse, False) == theirs
    assert len(theirs) > size


@pytest.mark.parametrize("errorlog", ["-", "/some/file"])
def test_the_lanes_wsgi_errors_are_gunicorns(errorlog: str) -> None:
    """``LaneErrors`` (its logger looked up once): the streams gunicorn's
    ``WSGIErrorsWrapper`` writes to, also after the error log's handlers changed (a
    reopened file is a new stream)."""
    import io
    import logging

    from protoflask.head_lane import LaneErrors

    config = Config()
    config.set("errorlog", errorlog)
    log = logging.getLogger("gunicorn.error")
    saved = log.handlers[:]
    try:
        for streams in ([io.StringIO()], [io.StringIO(), io.StringIO()], []):
            log.handlers = [logging.StreamHandler(s) for s in streams] + [logging.NullHandler()]
            ours = LaneErrors(config)
            theirs = wsgi.WSGIErrorsWrapper(config)
            assert ours.streams == theirs.streams
            assert isinstance(ours, wsgi.WSGIErrorsWrapper)
    finally:
        log.handlers = saved


@pytest.mark.parametrize("at_once", [True, False])
def test_the_peek_leaves_the_bytes_and_waits_at_most_its_timeout(at_once: bool) -> None:
    """``HeadLane.peek``, tried at once or not (the swap point ``peek_at_once``): the
    bytes there (waited for when none were), left on the socket; b"" once nothing came
    within the timeout, or the peer reset; the socket blocking again after either."""
    import socket
    import struct
    import time

    import gevent
    import gevent.socket

    from protoflask.head_lane import HeadLane

    lane = object.__new__(HeadLane)
    lane.peek_at_once = at_once
    peek = HeadLane.peek.__get__(lane)
    ours, theirs = gevent.socket.socketpair()
    try:
        gevent.spawn_later(0.02, theirs.sendall, b"GET / HTTP/1.1\r\n")  # not yet there
        assert peek(ours, 5.0) == b"GET / HTTP/1.1\r\n"
        assert ours.gettimeout() is None
        theirs.sendall(b"\r\n")
        gevent.sleep(0.01)
        assert peek(ours, 5.0) == b"GET / HTTP/1.1\r\n\r\n"
        assert ours.gettimeout() is None
        assert ours.recv(100) == b"GET / HTTP/1.1\r\n\r\n"  # still there: peeked
        started = time.monotonic()
        assert peek(ours, 0.05) == b""
        assert 0.04 <= time.monotonic() - started < 1.0
        assert ours.gettimeout() is None
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        theirs.close()  # a reset
        gevent.sleep(0.01)
        assert peek(ours, 5.0) == b""
    finally:
        ours.close()
        theirs.close()


LAZY_BODIES = [b"", HELLO, HELLO + b'{"type":"PING"}\n', b"no newline at the end",
               b"\n\n" + HELLO + b"\r\n", b"x" * 3000 + b"\n" + b"y" * 100]


@pytest.mark.parametrize("body", LAZY_BODIES)
def test_a_lazy_input_reads_what_gunicorns_reader_reads(body: bytes) -> None:
    """``head_lane.LazyInput`` (the swap point ``HeadLane.lazy_input``): not made until
    used (fails with the reader made at once), then every read gunicorn's reader's."""
    from protoflask.head_lane import LazyInput
    from protoflask.transports.request_body import body_pieces

    def head() -> HeadRequest:
        data = (f"POST /proto/stream HTTP/1.1\r\nHost: a\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        read = parse_head(data, HeadLimits.of(cfg()))
        assert read is not None
        return read

    lazy_head = head()
    lazy = LazyInput(lazy_head)
    assert lazy_head._body is None  # nothing made until the first read

    def in_parts(inp: Any) -> list[bytes]:
        return [inp.read(5), inp.readline(7), inp.readline(), inp.read()]

    def reads(make: Any) -> list[Any]:
        return [make().read(), in_parts(make()), list(make()), make().readlines(),
                list(body_pieces({"wsgi.input": make()}))]

    plain = reads(lambda: head().body)
    assert reads(lambda: LazyInput(head())) == plain
    assert lazy.read() == body


# -- the upgrade's environ, lean and whole ----------------------------------------------------


class Upgrades:
    """In ``SessionPostLane``'s place: records what the lane hands an upgrade, refuses it."""

    refusals: dict[Any, Any] = {}

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], Any]] = []

    def upgrade(self, environ: dict[str, Any], taking: Any, handshake: Any = None) -> bool:
        self.seen.append((environ, handshake))
        return False


@pytest.mark.parametrize("case", sorted(c for c in READ if READ[c].startswith("GET /proto/ws")
                                        or "/proto/websocket" in READ[c].split("\r\n")[0]))
def test_the_lean_upgrade_hands_over_what_the_whole_environ_did(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of the swap point ``HeadLane.lean_upgrade``: the handshake
    ``serve_apart`` serves, and every value the upgrade reads, the same."""
    head = parse_head(READ[case].encode("latin-1"), HeadLimits.of(Config()))
    assert head is not None and head.is_upgrade
    served = []
    for lean in (True, False):
        monkeypatch.setattr(HeadLane, "lean_upgrade", lean)
        post_lane = Upgrades()
        lane = HeadLane(post_lane, Config())  # type: ignore[arg-type]
        listener = type("Listener", (), {"getsockname": lambda self: SERVER})()
        assert lane.upgrade(head, "sock", PEER, listener) is False
        (environ, handshake), = post_lane.seen
        assert (handshake is not None) is lean
        served.append((served_handshake(environ) if handshake is None
                       else list(handshake.items()),
                       {k: environ.get(k) for k in ("gunicorn.socket", "REQUEST_METHOD",
                                                    "QUERY_STRING", "HTTP_HOST",
                                                    "HTTP_UPGRADE", "HTTP_CONNECTION",
                                                    "HTTP_ORIGIN", "HTTP_AUTHORIZATION")}))
    assert served[0] == served[1]


@pytest.mark.parametrize("at_once", [True, False])
def test_the_take_off_leaves_what_follows_the_head(at_once: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``HeadLane.take_off`` both ways (``peek_at_once``): the head and its body taken off
    the socket, the bytes after them left for whoever reads next."""
    import gevent.socket

    monkeypatch.setattr(HeadLane, "peek_at_once", at_once)
    data = b"POST /proto/stream HTTP/1.1\r\nContent-Length: 17\r\n\r\n" + HELLO
    head = parse_head(data, HeadLimits.of(Config()))
    assert head is not None
    ours, theirs = gevent.socket.socketpair()
    try:
        theirs.sendall(data + b"NEXT")
        gevent.sleep(0.01)
        HeadLane.take_off(ours, head)
        ours.settimeout(1.0)  # (a take-off that took too much leaves nothing: a timeout)
        assert ours.recv(100) == b"NEXT"
    finally:
        ours.close()
        theirs.close()


# -- a stream open's environ, lean and whole --------------------------------------------------


class Opens:
    """In ``SessionPostLane``'s place: records what the lane hands a stream open, refuses
    it."""

    refusals: dict[Any, Any] = {}

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], str, Any]] = []

    def open(self, environ: dict[str, Any], kind: str, args: Any = None) -> Any:
        self.seen.append((environ, kind, args))
        return None


#: what SessionPostLane.open and the SSE and NDJSON streams read of an open's environ
STREAM_READS = ("gunicorn.socket", "protoflask.socket", "REQUEST_METHOD", "QUERY_STRING",
                "PATH_INFO", "HTTP_ORIGIN", "HTTP_AUTHORIZATION", "HTTP_LAST_EVENT_ID",
                "CONTENT_LENGTH", "CONTENT_TYPE", CARRIED_BODY)


@pytest.mark.parametrize("case", sorted(c for c in READ if READ[c].split(" ")[1]
                                        .startswith(("/proto/sse", "/proto/stream"))))
def test_a_lean_open_hands_over_what_the_whole_environ_did(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of the swap point ``HeadLane.lean_open`` (and ``whole``, the access log
    on): every key the open and the stream read the same, the body read the same; the
    whole environ where the access log reads it, whichever the swap point."""
    from protoflask.post_lane import plain_query

    data = READ[case].encode("latin-1")
    if plain_query(data.split(b" ")[1].partition(b"?")[2].decode()) is None:
        return  # (a query Flask decodes: the lane hands nothing over)
    handed = []
    for lean, whole in ((True, False), (False, False), (True, True)):
        head = parse_head(data, HeadLimits.of(Config()))
        assert head is not None
        monkeypatch.setattr(HeadLane, "lean_open", lean)
        post_lane = Opens()
        lane = HeadLane(post_lane, Config())  # type: ignore[arg-type]
        listener = type("Listener", (), {"getsockname": lambda self: SERVER})()
        assert lane.open(head, "sock", PEER, listener, whole=whole) is None
        if not post_lane.seen:
            handed.append(None)  # (a session's batch: left to gunicorn either way)
            continue
        (environ, kind, args), = post_lane.seen
        assert ("SERVER_NAME" in environ and "wsgi.errors" in environ) is (whole or not lean)
        handed.append((kind, args, {k: environ.get(k) for k in STREAM_READS},
                       environ["wsgi.input"].read()))
    assert handed[0] == handed[1] == handed[2]
