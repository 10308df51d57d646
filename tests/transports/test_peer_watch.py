"""An HTTP stream notices its client going away with a read watcher on the event loop
(``sockets.PeerWatch``, swap point ``HTTPDownstream.watch_without_greenlet``; the
socket's own read watcher or one of its own: ``PeerWatch.socket_watcher``) as it did
with a greenlet waiting in ``recv(1, MSG_PEEK)``: the same ends for the same peers,
both ways, on real gevent sockets."""

from __future__ import annotations

import io
import re
import socket
from typing import Any, Iterator

import gevent
import gevent.socket
import pytest

from protoflask import ProtoServer
from protoflask.port import Ports
from protoflask.transports import sse
from protoflask.transports.http import HTTPDownstream
from protoflask.transports.sockets import PeerWatch, peer_watch

from ..support import SECRET


@pytest.fixture(scope="module")
def server() -> Iterator[ProtoServer]:
    yield ProtoServer({"jwtSecret": SECRET, "enableLogging": False,
                       "maxConnectionsPerUser": 100})


def run_sse(server: ProtoServer, without_greenlet: bool, peer: str,
            socket_watcher: bool = True) -> dict[str, Any]:
    """An SSE stream on a socket pair whose client then does ``peer``; what happened.
    ``socket_watcher``: ``PeerWatch.socket_watcher`` (the socket's own read watcher)."""
    near, far = gevent.socket.socketpair()
    environ: dict[str, Any] = {"wsgi.input": io.BytesIO(b""), "gunicorn.socket": near}
    token = server.engine.authority.issue("alice")
    old = HTTPDownstream.watch_without_greenlet
    HTTPDownstream.watch_without_greenlet = without_greenlet
    PeerWatch.socket_watcher = socket_watcher
    chunks: list[bytes] = []
    try:
        response = sse.stream_response(Ports(server.engine), {}, f"Bearer {token}", "",
                                       environ)
        body = response.response
        downstream = body._stream
        pump = gevent.spawn(lambda: [chunks.append(c) for c in body])
        gevent.sleep(0.05)
        watcher = downstream._watcher
        own = isinstance(watcher, PeerWatch) and watcher._io is near._read_event
        if peer == "closes":
            far.close()
        elif peer == "shuts its write side":
            far.shutdown(socket.SHUT_WR)
        elif peer == "resets":
            far.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            far.close()
        elif peer == "pipelines":
            far.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        pump.join(0.5)
        ended = pump.dead
        if not ended:  # the server ends it (a pipelined request stays unread)
            downstream.close(1000, "done")
            pump.join(2)
        body.close()
        left = b""
        if peer == "pipelines":  # read as gunicorn reads the next request: a wait, free
            near.settimeout(1)
            left = near.recv(64, socket.MSG_PEEK)
        return {"ended by the peer": ended, "pump done": pump.dead, "own watcher": own,
                "watcher kind": type(watcher).__name__, "left unread": left,
                "still watching": isinstance(watcher, PeerWatch) and watcher.watching,
                "wrote": re.sub(rb"[0-9a-f]{32}", b"<session>", b"".join(chunks))}
    finally:
        HTTPDownstream.watch_without_greenlet = old
        PeerWatch.socket_watcher = True
        near.close()
        far.close()


@pytest.mark.parametrize("peer", ["closes", "shuts its write side", "resets", "pipelines",
                                  "stays"])
def test_the_watch_ends_streams_as_the_greenlet_did(server: ProtoServer, peer: str) -> None:
    watched = run_sse(server, True, peer)
    apart = run_sse(server, True, peer, socket_watcher=False)  # a watcher of its own
    waited = run_sse(server, False, peer)
    assert watched["watcher kind"] == apart["watcher kind"] == "PeerWatch"
    assert watched["own watcher"] and not apart["own watcher"]
    assert waited["watcher kind"] == "Greenlet"
    for key in ("ended by the peer", "pump done", "left unread", "wrote"):
        assert watched[key] == waited[key] == apart[key], key
    assert not apart["still watching"]
    assert watched["ended by the peer"] == (peer in ("closes", "shuts its write side",
                                                     "resets"))
    assert watched["pump done"]
    assert not watched["still watching"]  # stopped by the stream's end either way


def test_a_socket_without_a_descriptor_to_peek_gets_the_greenlet() -> None:
    class Fake:
        def fileno(self) -> int:
            return 0

    assert peer_watch(Fake(), lambda: None) is None
    import gevent.ssl

    near, far = gevent.socket.socketpair()
    try:
        tls = gevent.ssl.SSLSocket.__new__(gevent.ssl.SSLSocket)  # the class is enough
        assert peer_watch(tls, lambda: None) is None
        watch = peer_watch(near, lambda: None)
        assert isinstance(watch, PeerWatch)
        watch.kill()
    finally:
        near.close()
        far.close()


def test_a_spurious_wake_keeps_watching() -> None:
    near, far = gevent.socket.socketpair()
    gone: list[bool] = []
    try:
        watch = PeerWatch(near, lambda: gone.append(True))
        watch._readable()  # nothing to read: BlockingIOError inside, still watching
        assert watch.watching and not gone
        far.close()
        gevent.sleep(0.05)
        assert gone == [True] and not watch.watching
    finally:
        near.close()


def test_an_open_stream_keeps_no_close_event(server: ProtoServer) -> None:
    """``HTTPDownstream._taken`` (what the response waits on once closed) is made by
    ``close``: an open stream keeps one object less (fails with it made at the open)."""
    near, far = gevent.socket.socketpair()
    environ: dict[str, Any] = {"wsgi.input": io.BytesIO(b""), "gunicorn.socket": near}
    token = server.engine.authority.issue("alice")
    try:
        body = sse.stream_response(Ports(server.engine), {}, f"Bearer {token}", "",
                                   environ).response
        downstream = body._stream
        chunks: list[bytes] = []
        pump = gevent.spawn(lambda: [chunks.append(c) for c in body])
        gevent.sleep(0.05)
        assert "_taken" not in vars(downstream) and chunks
        downstream.close(1000, "done")
        assert downstream._taken.is_set()
        pump.join(2)
        assert pump.dead
        body.close()
    finally:
        near.close()
        far.close()
