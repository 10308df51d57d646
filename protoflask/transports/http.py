"""What the two HTTP transports (SSE and NDJSON streaming) share.

* ``HTTPDownstream``: a streaming response body that is a session's live transport. The
  WSGI server's request greenlet iterates it and is the single writer of the connection;
  ``wake`` (run by the event loop when the port's bell rings) only sets an Event the
  generator waits on. Each wake
  becomes one chunk (everything the session has ready), which gevent.pywsgi and gunicorn
  write and flush at once. Subclasses only frame bytes (``preamble``, ``frame``,
  ``keepalive_frame``, ``closing_frame``).
* A client that went away is noticed three ways: a failing write (the server stops
  iterating and closes the body), the end of the socket's read side (a greenlet peeks at
  the socket once the request body is consumed, as nginx does for a streaming upstream),
  and the periodic writes (SSE keep-alive comments, heartbeat PINGs). Each ends the
  response and detaches the session, so the ``disconnect`` signal fires and the socket is
  closed rather than left in CLOSE_WAIT.
* The POST endpoint both share: the body is read here (``request_body``) for the one
  place the session POST is answered (``port.Ports.answer_post``).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Generator, Iterator, Mapping

import gevent
import gevent.event
import orjson
from flask import Request, Response
from werkzeug.utils import get_content_type

from ..auth import token_from_request
from ..core.errors import ProtoError
from ..port import PostAnswer
from .request_body import read_body
from .sockets import PeerWatch, peer_watch, raw_socket, shutdown

if TYPE_CHECKING:
    from ..port import Ports, SessionPort

__all__ = ["PostAnswer", "answer_post", "post_messages", "HTTPDownstream"]

log = logging.getLogger("protoflask.http")

#: Headers of every streaming response: never cached, never buffered by a proxy.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: Longest pause between two writes on an idle SSE stream (capped by heartbeatInterval).
KEEPALIVE_SECONDS = 15.0
#: How long a response that ended before its request body did keeps reading that body,
#: so unread request bytes do not turn the close into a reset that eats the response tail.
LINGER_SECONDS = 1.0
#: How long a response the server ended may take to write its tail before the socket is
#: cut (a client that stopped reading blocks the write forever).
CLOSE_TIMEOUT = 2.0


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def error_response(exc: ProtoError) -> Response:
    response = json_response(exc.to_http_body(), exc.http_status)
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def answer_post(ports: "Ports", args: Mapping[str, str], authorization: str | None,
                environ: dict[str, Any]) -> PostAnswer:
    """POST /proto/sse?session=<id> and the stream's follow-up POST: the port lets it in
    (``Ports.open_post``), the body is read from ``environ`` here, and the port answers
    it (``Ports.answer_post``): each a call down. ``args`` is the query,
    ``authorization`` the header. Flask's route (``post_messages``) and protoflask's own
    app's lane (``post_lane``) both answer with this."""
    admission = ports.open_post(args, token_from_request(args.get("token"), authorization))
    if isinstance(admission, PostAnswer):
        return admission
    limits = ports.limits
    try:
        body: bytes | ProtoError = read_body(environ, limits.max_message_size,
                                             limits.body_timeout)
    except ProtoError as exc:
        body = exc
    except BaseException:
        ports.abandon_post(admission)
        raise
    return ports.answer_post(admission, body)


def post_messages(ports: "Ports", request: Request) -> Response:
    """The session POST as a Flask response (see ``answer_post``)."""
    answer = answer_post(ports, request.args, request.headers.get("Authorization"),
                         request.environ)
    response = Response(answer.encoded(), status=answer.status, mimetype="application/json")
    if answer.close:
        response.headers["Connection"] = "close"
    if answer.retry_after is not None:
        response.headers["Retry-After"] = str(answer.retry_after)
    return response


# -- downstream: the streaming response -----------------------------------------------


class HTTPDownstream:
    """A streaming response that is one session's live transport (see the module doc)."""

    kind = "http"
    mimetype = "application/octet-stream"
    #: no greenlet of this transport pulls after its calls: every ring is answered
    reader = None
    #: ``started`` left its rings to the first take (``NDJSONStream.quiet_hand_over``)
    _pull_after = False
    _taken: gevent.event.Event  # set once close() has taken what it takes (made there)

    def __init__(self, port: "SessionPort", environ: dict[str, Any]) -> None:
        self.port = port
        self.environ = environ
        self.sock: socket.socket | None = raw_socket(environ)
        self.keepalive = max(0.05, min(KEEPALIVE_SECONDS,
                                       port.limits.heartbeat_interval / 1000.0))
        self._event = gevent.event.Event()
        self._final: list[tuple[int, bytes]] = []
        self._closing: tuple[int, str] | None = None
        self._gone = False
        self._attached = False
        self._finished = False
        self._watcher: gevent.Greenlet | PeerWatch | None = None

    # -- framing: what subclasses define ------------------------------------------------

    def preamble(self) -> bytes:
        return b""

    def frame(self, seq: int, data: bytes) -> bytes:
        raise NotImplementedError

    def frames(self, ready: list[tuple[int, bytes]]) -> bytes:
        """Every message of ``ready`` framed, as one chunk; a subclass may do it in one
        go, byte for byte what ``frame`` gives message by message."""
        frame = self.frame
        return b"".join([frame(seq, data) for seq, data in ready])

    def keepalive_frame(self) -> bytes:
        return b""

    def closing_frame(self, code: int, reason: str) -> bytes:
        return b""

    # -- Transport -------------------------------------------------------------------

    def wake(self) -> None:
        self._event.set()

    def close(self, code: int, reason: str) -> None:
        """Take what is pending now (it belongs to this stream), then end the response.

        The response's greenlet stays the one writer, in seq order: from here it takes
        nothing fresh (``_take``), and writes its tail once what is taken here is in
        ``_final``. (Taking may wait for the cluster's journal; a fresh take meanwhile
        could write a later seq first, and the client, which skips any seq below the
        last it had, would never see this one: the drain's lost TOOL_DONEs.)"""
        if self._closing is not None or self._finished:
            return
        # made here, not with the stream: only a closing stream waits on it (an open
        # stream keeps one object less)
        self._taken = gevent.event.Event()  # close() has taken what it takes
        self._closing = (code, reason)
        try:
            final = self.port.take_final()
            self._final.extend(final)  # (the list now: the response may have swapped it)
        finally:
            self._taken.set()
            self._event.set()
        gevent.spawn_later(CLOSE_TIMEOUT, self._cut_if_stuck)

    def _cut_if_stuck(self) -> None:
        if not self._finished and self.sock is not None:
            log.info("%s %s: response did not end within %.0fs of closing; cutting it",
                     self.kind, self.port.id, CLOSE_TIMEOUT)
            shutdown(self.sock)

    # -- the response ------------------------------------------------------------------

    def response(self, headers: dict[str, str] | None = None) -> Response:
        resp = Response(_Body(self), status=200, mimetype=self.mimetype)
        resp.headers.update(STREAM_HEADERS)
        resp.headers["Proto-Session"] = self.port.id
        if headers:
            resp.headers.update(headers)
        return resp

    def wsgi_app(self, extra: list[tuple[str, str]]) -> StreamApp:
        """The response as ``response()`` is to the server (its status and headers, with
        ``extra`` after them, as werkzeug adds new ones), without werkzeug's objects: a
        Response and its Headers, the WSGI headers built from them, and a ClosingIterator
        around the body (tests/transports/test_stream_app.py holds them equal)."""
        content_type = self._content_type or self._make_content_type()
        return StreamApp([("Content-Type", content_type), *STREAM_HEADER_LIST,
                          ("Proto-Session", self.port.id), *extra], _Body(self))

    _content_type = ""  # werkzeug's Content-Type of ``mimetype`` (the charset for text/*)

    @classmethod
    def _make_content_type(cls) -> str:
        cls._content_type = get_content_type(cls.mimetype, "utf-8")
        return cls._content_type

    def _take(self, final: bool = False) -> bytes:
        if not final and self._closing is not None:
            return b""  # close() takes what is left; the tail writes it
        out = self._final
        self._final = []
        out.extend(self.port.take_final() if final else self.port.take())
        return self.frames(out) if out else b""

    def _pump(self) -> Generator[bytes, None, None]:
        """The response body: attach, then write whatever the session has, as it comes."""
        try:
            self.port.attach(self)
            self._attached = True
            self.started()
            chunk = self.preamble() + self._take()
            if self._pull_after:  # rings were left to this take (NDJSONStream's hand-over)
                self._pull_after = False
                if self.port.has_writable():  # what a ring would have woken it for
                    self._event.set()
            if not chunk:
                # Nothing to write yet (a caught-up resume, a new stream before its HELLO):
                # an empty chunk makes the server send the status line and headers now, so
                # a client that waits for them before writing its body is not stuck.
                yield b""
            keepalive = self.keepalive_frame()
            last_write = time.monotonic()
            while True:
                if chunk:
                    yield from self._write(chunk)
                    last_write = time.monotonic()
                if self._gone:
                    return
                if self._closing is not None:
                    self._taken.wait()  # close() is taking what is left for this stream
                    tail = self._take(final=True) + self.closing_frame(*self._closing)
                    if tail:
                        yield from self._write(tail)
                    return
                # Wakes come often (every send, every heartbeat tick): the keep-alive is
                # due by the time since the last write, not by a quiet wait.
                idle = time.monotonic() - last_write
                chunk = b""
                if self._event.wait(max(0.0, self.keepalive - idle) if keepalive else None):
                    self._event.clear()
                    chunk = self._take()
                if not chunk and keepalive and \
                        time.monotonic() - last_write >= self.keepalive:
                    chunk = keepalive
        finally:
            self._finish()

    def _write(self, chunk: bytes) -> Iterator[bytes]:
        """Yield one chunk to the server, which writes it; while it does, the session's
        back-pressure counts it as in flight."""
        port = self.port
        mine = port.attached
        if mine:
            port.in_flight(len(chunk))
        yield chunk
        if mine and port.attached:
            port.in_flight(0)
            if port.has_writable():  # e.g. a RESUME_CHANNEL the drained buffer queued
                self._event.set()

    def started(self) -> None:
        """Attached and about to write; the stream starts its body reader here."""
        self.watch_peer()

    #: The swap point of the watch: a read watcher on the event loop (``PeerWatch``)
    #: where the socket has a descriptor to peek at, else (and with False) a greenlet that
    #: waits in ``recv(1, MSG_PEEK)``. tests/transports/test_peer_watch.py holds them equal.
    watch_without_greenlet = True

    def watch_peer(self) -> None:
        """Once nothing else reads the socket: notice the client closing it."""
        if self.sock is not None and self._watcher is None and not self._finished:
            watch = peer_watch(self.sock, self.gone) if self.watch_without_greenlet else None
            self._watcher = watch if watch is not None else gevent.spawn(self._watch_peer)

    def _watch_peer(self) -> None:
        assert self.sock is not None
        try:
            data = self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            data = b""
        if not data:  # EOF or reset; data would be a pipelined request: leave it
            self.gone()

    def gone(self) -> None:
        """The client went away: end the response at once."""
        self._gone = True
        self._event.set()

    def _finish(self) -> None:
        """Detach and give the connection slot back; once, however the response ends."""
        if self._finished:
            return
        self._finished = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill(block=True)
        self.port.end()

    def after_response(self) -> None:
        """Called once the server wrote the end of the response."""


#: STREAM_HEADERS in the order werkzeug's ``update`` adds them
STREAM_HEADER_LIST = tuple(STREAM_HEADERS.items())


class StreamApp:
    """A stream's response as a WSGI application (``HTTPDownstream.wsgi_app``)."""

    __slots__ = ("headers", "body")

    def __init__(self, headers: list[tuple[str, str]], body: _Body) -> None:
        self.headers = headers
        self.body = body

    def __call__(self, environ: dict[str, Any], start_response: Any) -> _Body:
        start_response("200 OK", self.headers)
        return self.body


class _Body:
    """The WSGI iterable: the pump generator plus a ``close`` the server always calls
    (even when the body was never iterated, e.g. for HEAD)."""

    def __init__(self, stream: HTTPDownstream) -> None:
        self._stream = stream
        self._gen = stream._pump()

    def __iter__(self) -> Iterator[bytes]:
        return self._gen

    def close(self) -> None:
        try:
            self._gen.close()
        finally:
            self._stream._finish()
            self._stream.after_response()
