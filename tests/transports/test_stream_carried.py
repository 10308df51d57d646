"""An NDJSON stream whose opening body the server carried whole (the head lane's opening
POST: ``stream.CARRIED_BODY``) hands its lines to the session in the response's greenlet
(``NDJSONStream.hand_carried_body``): byte for byte what the reader greenlet's way gives,
body by body, in this process (an unstarted ProtoServer's engine, a real socket pair)."""

from __future__ import annotations

import io
import re
import time
from typing import Any, Iterator

import gevent
import gevent.socket
import pytest

from protoflask import ProtoServer
from protoflask.port import Ports
from protoflask.transports import stream
from protoflask.transports.stream import CARRIED_BODY, NDJSONStream
from protoflask.turns import COSTLY, Pacer

from ..support import SECRET

LIMIT = 512
HELLO = (b'{"id":"c1","session":"","seq":"1","ts":"0","type":"HELLO","channel":"SYSTEM",'
         b'"payload":{"proto_version":"1.1.2","accept_major":[1],"accept_events":[]}}')
PING = (b'{"id":"c2","session":"","seq":"2","ts":"0","type":"PING","channel":"SYSTEM",'
        b'"payload":{"nonce":"n1"}}')
BODIES = {
    "HELLO": HELLO + b"\n",
    "HELLO, PING": HELLO + b"\n" + PING + b"\n",
    "HELLO, PING, no last newline": HELLO + b"\n" + PING,
    "blank lines": b"\n\r\n" + HELLO + b"\r\n\n",
    "not JSON": b"nope\n",
    "a line over maxMessageSize": HELLO + b"\n" + b"x" * (LIMIT + 10) + b"\n",
    "a version refused": HELLO.replace(b'"accept_major":[1]', b'"accept_major":[9]') + b"\n",
    "PING before HELLO": PING + b"\n",
    "empty": b"",
}


@pytest.fixture(scope="module")
def server() -> Iterator[ProtoServer]:
    yield ProtoServer({"jwtSecret": SECRET, "maxMessageSize": LIMIT, "enableLogging": False,
                       "maxConnectionsPerUser": 100})


def written(server: ProtoServer, body: bytes, carried: bool, quiet: bool = True,
            wakes: list[int] | None = None) -> bytes:
    """What the stream's response writes for ``body`` until it is quiet for a moment, made
    comparable (the session id, timestamps and message ids); ``quiet``: the swap point
    ``NDJSONStream.quiet_hand_over``; ``wakes`` gets how often the response was woken."""
    near, far = gevent.socket.socketpair()
    environ: dict[str, Any] = {
        "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
        "REQUEST_METHOD": "POST", "PATH_INFO": "/proto/stream", "QUERY_STRING": "",
        "gunicorn.socket": near, CARRIED_BODY: body}
    token = server.engine.authority.issue("alice")
    old = NDJSONStream.hand_carried_body, NDJSONStream.quiet_hand_over, NDJSONStream.wake
    NDJSONStream.hand_carried_body = carried
    NDJSONStream.quiet_hand_over = quiet
    if wakes is not None:
        def wake(self: NDJSONStream) -> None:
            wakes.append(1)
            old[2](self)
        NDJSONStream.wake = wake  # type: ignore[method-assign]
    try:
        response = stream.stream_response(Ports(server.engine), {}, f"Bearer {token}", environ)
        chunks: list[bytes] = []
        body_iter = response.response
        pump = gevent.spawn(lambda: [chunks.append(c) for c in body_iter])
        gevent.sleep(0.2)
        far.close()  # the client goes away: the watcher ends the response
        pump.join(2)
        assert pump.dead
        body_iter.close()
    finally:
        NDJSONStream.hand_carried_body, NDJSONStream.quiet_hand_over = old[:2]
        NDJSONStream.wake = old[2]  # type: ignore[method-assign]
        near.close()
    out = b"".join(chunks)
    out = re.sub(rb'"ts":"\d+"', b'"ts":"-"', out)
    out = re.sub(rb'"id":"[^"]*"', b'"id":"-"', out)
    return re.sub(rb"[0-9a-f]{32}", b"<session>", out)


@pytest.mark.parametrize("quiet", [True, False])
@pytest.mark.parametrize("case", list(BODIES))
def test_a_carried_body_is_answered_as_the_reader_answers_it(server: ProtoServer,
                                                             case: str, quiet: bool) -> None:
    carried = written(server, BODIES[case], carried=True, quiet=quiet)
    read = written(server, BODIES[case], carried=False)
    assert carried == read
    if case.startswith("HELLO"):
        assert b'"type":"HELLO"' in carried, carried


def test_a_quiet_hand_over_wakes_the_response_for_nothing_less(server: ProtoServer) -> None:
    """The HELLO's reply rang the bell in the hand-over; the first take wrote it: with
    ``quiet_hand_over`` that ring wakes no one, without it the response once."""
    counts = []
    for quiet in (True, False):
        wakes: list[int] = []
        out = written(server, BODIES["HELLO"], carried=True, quiet=quiet, wakes=wakes)
        assert b'"type":"HELLO"' in out
        counts.append(len(wakes))
    assert counts[0] < counts[1], counts


def test_without_a_carried_body_the_reader_reads_it(server: ProtoServer) -> None:
    """No CARRIED_BODY (gunicorn's parser, protoflask's own server): the reader greenlet."""
    near, far = gevent.socket.socketpair()
    environ: dict[str, Any] = {"wsgi.input": io.BytesIO(BODIES["HELLO"]),
                               "CONTENT_LENGTH": str(len(BODIES["HELLO"])),
                               "gunicorn.socket": near}
    token = server.engine.authority.issue("alice")
    response = stream.stream_response(Ports(server.engine), {}, f"Bearer {token}", environ)
    body_iter = response.response
    try:
        assert next(iter(body_iter)) == b""  # the head first: the reader has not run yet
        downstream = body_iter._stream
        assert downstream._reader is not None
    finally:
        far.close()
        body_iter.close()
        near.close()


@pytest.mark.parametrize("carried", [True, False], ids=["carried", "read"])
def test_a_costly_body_is_told_to_the_pacer_either_way(carried: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A body whose handling is costly (here the application's ``handshake`` listener
    works 15 ms) is a costly turn of its user's, told to the worker's pacer, whether the
    server carried it or the reader read it; the carried way first waits out what the
    user owes (``Pacer.pause``) and answers the HELLO all the same. Without the carried
    way's ``took`` a flooder could pass the pacing by sending each message in an opening
    POST of its own (docs/RELIABILITY.md §22, "Costly messages and the worker's turns")."""
    costly = ProtoServer({"jwtSecret": SECRET, "enableLogging": False,
                          "maxConnectionsPerUser": 100})

    def busy(session_id: str, payload: Any) -> None:  # the application's costly work
        until = time.perf_counter() + 1.5 * COSTLY
        while time.perf_counter() < until:
            pass

    costly.on("handshake", busy)
    calls: list[tuple[Any, ...]] = []
    pause, took = Pacer.pause, Pacer.took
    monkeypatch.setattr(Pacer, "pause", lambda self, user: (
        calls.append(("pause", user)), pause(self, user))[1])
    monkeypatch.setattr(Pacer, "took", lambda self, user, seconds: (
        calls.append(("took", user, seconds)), took(self, user, seconds))[1])
    out = written(costly, BODIES["HELLO"], carried=carried)
    assert b'"type":"HELLO"' in out, out
    told = [c for c in calls if c[0] == "took" and c[2] >= COSTLY]
    assert [c[1] for c in told] == ["alice"], calls
    if carried:
        assert calls[0] == ("pause", "alice"), calls  # what they owe, before the body
