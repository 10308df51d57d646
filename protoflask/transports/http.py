"""What the two HTTP transports (SSE and NDJSON streaming) share.

* ``HTTPDownstream``: a streaming response body that is a session's live transport. The
  WSGI server's request greenlet iterates it and is the single writer of the connection;
  ``wake`` only sets an Event the generator waits on, so no sender ever blocks. Each wake
  becomes one chunk (everything the session has ready), which gevent.pywsgi and gunicorn
  write and flush at once. Subclasses only frame bytes (``preamble``, ``frame``,
  ``keepalive_frame``, ``closing_frame``).
* A client that went away is noticed three ways: a failing write (the server stops
  iterating and closes the body), the end of the socket's read side (a greenlet peeks at
  the socket once the request body is consumed, as nginx does for a streaming upstream),
  and the periodic writes (SSE keep-alive comments, heartbeat PINGs). Each ends the
  response and detaches the session, so the ``disconnect`` signal fires and the socket is
  closed rather than left in CLOSE_WAIT.
* Upstream bodies of the POST endpoints: one envelope, a JSON array or NDJSON, whatever
  the Content-Type says (``deliver_body``), and request bodies read line by line as they
  arrive (``body_pieces`` + ``iter_lines``) for the full-duplex stream.
"""

from __future__ import annotations

import io
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import gevent
import gevent.event
import orjson
from flask import Request, Response

from ..auth import token_from_request
from ..core.envelope import MAX_SEQ, SEQ_DIGITS
from ..core.errors import InvalidMessage, MessageTooLarge, ProtoError, RequestTimeout
from ..clock import now_ms
from .websocket import raw_socket

if TYPE_CHECKING:
    from ..engine import Engine
    from ..hub import LiveSession

log = logging.getLogger("protoflask.http")
access_log = logging.getLogger("protoflask.access")

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
#: Largest piece read from a request body at once.
PIECE_SIZE = 65536


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def error_response(exc: ProtoError) -> Response:
    return json_response(exc.to_http_body(), exc.http_status)


def parse_seq_arg(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    if not is_seq(value):
        raise InvalidMessage(f"{name} must be a decimal number of at most {MAX_SEQ} "
                             f"(2^53-1), got {value[:80]!r}")
    return int(value)


def is_seq(value: str) -> bool:
    """ASCII digits only (str.isdigit also takes '²', which int() refuses), a number no
    larger than any seq can be (MAX_SEQ, 2^53-1)."""
    return 0 < len(value) <= SEQ_DIGITS and value.isascii() and value.isdigit() \
        and int(value) <= MAX_SEQ


# -- upstream: POST bodies ------------------------------------------------------------


def read_body(environ: dict[str, Any], limit: int, timeout_ms: int | None = None) -> bytes:
    """The whole request body, or MessageTooLarge once it passes ``limit`` bytes, or
    RequestTimeout (408) when it has not all arrived within ``timeout_ms`` (bodyTimeout:
    a client trickling its body must not hold a connection and a greenlet forever)."""
    length = environ.get("CONTENT_LENGTH") or ""
    if length.isdigit() and int(length) > limit:
        raise MessageTooLarge(f"body of {length} bytes exceeds maxMessageSize ({limit})")
    inp = environ["wsgi.input"]
    parts: list[bytes] = []
    total = 0
    deadline = gevent.Timeout.start_new(
        timeout_ms / 1000.0, RequestTimeout(f"the request body did not arrive within "
                                            f"bodyTimeout ({timeout_ms} ms)")) \
        if timeout_ms else None
    try:
        while True:
            data = inp.read(min(PIECE_SIZE, limit + 1 - total))
            if not data:
                return b"".join(parts)
            total += len(data)
            if total > limit:
                raise MessageTooLarge(f"body exceeds maxMessageSize ({limit} bytes)")
            parts.append(data)
    finally:
        if deadline is not None:
            deadline.close()


_NOT_JSON = object()


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _encoded_size(item: Any, whole: int) -> int:
    """An array element's size in bytes for credit; ``whole`` (the body's size) when it
    cannot be encoded again (nested past orjson's limit: the session refuses it anyway)."""
    try:
        return len(orjson.dumps(item))
    except orjson.JSONEncodeError:
        return whole


def split_body(body: bytes) -> list[tuple[Any, Any]]:
    """A POST body's messages: (value, its size) for each one decoded here, or
    (_NOT_JSON, its bytes) for each one the session is to parse itself.

    The body is one JSON value (an envelope, or an array of envelopes) or NDJSON. A body
    of which no line is JSON at all raises InvalidMessage."""
    whole = _loads(body)
    if isinstance(whole, list):
        return [(item, _encoded_size(item, len(body))) for item in whole]
    if whole is not _NOT_JSON:
        return [(_NOT_JSON, body)]  # one envelope: the session's own parser reads it
    lines = [line.strip() for line in body.split(b"\n")]
    lines = [line for line in lines if line]
    decoded = [_loads(line) for line in lines]
    if all(obj is _NOT_JSON for obj in decoded):
        raise InvalidMessage("the body is not JSON, a JSON array or NDJSON")
    return [(obj, line) if obj is _NOT_JSON else (obj, len(line))
            for line, obj in zip(lines, decoded, strict=True)]


def deliver_body(engine: "Engine", live: "LiveSession", body: bytes) -> int:
    """Hand every message of a POST body to the session; returns how many.

    Each message meets the session's rules (its errors go downstream as ERROR messages).
    A body of which no line is JSON at all is reported in-protocol like a non-JSON
    WebSocket frame and then raised as InvalidMessage for the HTTP 400."""
    try:
        parts = split_body(body)
    except InvalidMessage:
        engine.receive(live, body)
        raise
    for value, size_or_bytes in parts:
        if value is _NOT_JSON:
            engine.receive(live, size_or_bytes)
        else:
            engine.receive_decoded(live, value, size_or_bytes)
    return len(parts)


def body_pieces(environ: dict[str, Any]) -> Iterator[bytes]:
    """A request body as it arrives, piece by piece, without waiting for more than the
    client sent. gevent.pywsgi's ``readline`` returns at each line end or chunk; gunicorn's
    chunked reader only returns once its buffer is full, so its pieces are taken from its
    chunk parser directly."""
    inp = environ["wsgi.input"]
    reader = _gunicorn_chunked_reader(inp)
    if reader is not None:
        for buf_owner in (inp, reader):
            data = buf_owner.buf.getvalue()
            if data:
                buf_owner.buf = io.BytesIO()
                yield data
        if reader.parser:
            for piece in reader.parser:
                if piece:
                    yield piece
            reader.parser = None
        return
    if _is_pywsgi_input(inp):
        yield from _pywsgi_pieces(inp)
        return
    while True:
        piece = inp.readline(PIECE_SIZE)
        if not piece:
            return
        yield piece


def _is_pywsgi_input(inp: Any) -> bool:
    try:
        from gevent.pywsgi import Input
    except ImportError:  # pragma: no cover - gevent is a dependency
        return False
    return isinstance(inp, Input) and all(
        hasattr(inp, a) for a in ("chunked_input", "chunk_length", "position", "rfile",
                                  "content_length"))


def _pywsgi_pieces(inp: Any) -> Iterator[bytes]:
    """gevent.pywsgi's body as it arrives. Its ``readline`` holds a partial line until the
    line ends (across chunks), which would hide a stalled line from the deadline; this
    reads each chunk's bytes as they come (a byte at a chunk boundary, then the rest of
    the chunk), or, without chunking, whatever the socket has."""
    while True:
        if inp.chunked_input:
            left = (inp.chunk_length or 0) - inp.position
            piece = inp.read(min(left, PIECE_SIZE) if left > 0 else 1)
        else:
            left = (inp.content_length or 0) - inp.position
            if left <= 0:
                return
            inp.read(0)  # answers Expect: 100-continue
            piece = inp.rfile.read1(min(left, PIECE_SIZE))
            if not piece:
                raise OSError("the request body ended early")
            inp.position += len(piece)
        if not piece:
            return
        yield piece


def _gunicorn_chunked_reader(inp: Any) -> Any:
    try:
        from gunicorn.http.body import Body, ChunkedReader
    except ImportError:  # pragma: no cover - gunicorn is a dependency
        return None
    if isinstance(inp, Body) and isinstance(inp.reader, ChunkedReader) \
            and hasattr(inp.reader, "parser") and hasattr(inp.reader, "buf"):
        return inp.reader
    return None


def iter_lines(pieces: Iterable[bytes], limit: int,
               stall_ms: int | None = None) -> Iterator[bytes]:
    """Non-blank lines (CR/LF stripped) from body pieces; a line may span any number of
    pieces. A line longer than ``limit`` is yielded cut at ``limit + 1`` bytes (enough for
    the session to reject it as too large) and ends the iteration. With ``stall_ms``
    (bodyTimeout), a partial line whose next piece does not come within it raises
    RequestTimeout; waiting between lines has no deadline (an idle duplex stream)."""
    buf = bytearray()
    source = iter(pieces)
    while True:
        if buf and stall_ms:
            with gevent.Timeout(stall_ms / 1000.0, RequestTimeout(
                    f"the body stalled inside a line for bodyTimeout ({stall_ms} ms)")):
                piece = next(source, None)
        else:
            piece = next(source, None)
        if piece is None:
            break
        buf += piece
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buf[start:end]).strip()
            start = end + 1
            if len(line) > limit:
                yield line[:limit + 1]
                return
            if line:
                yield line
        del buf[:start]
        if len(buf) > limit + 1:
            yield bytes(buf[:limit + 1])
            return
    line = bytes(buf).strip()
    if line:
        yield line


def post_messages(engine: "Engine", request: Request) -> Response:
    """POST /proto/sse?session=<id> and the stream's follow-up POST: 202 {"accepted": n}.

    The body's messages are handed to the session one by one; their protocol errors go
    downstream. A body over maxMessageSize is 413 and one that is not JSON at all is 400;
    both are also reported downstream as the ERROR a WebSocket frame would get."""
    live: "LiveSession | None" = None
    try:
        user_id = engine.authenticate(token_from_request(
            request.args.get("token"), request.headers.get("Authorization")),
            request.args.get("ticket"))
        session_id = request.args.get("session")
        if not session_id:
            raise InvalidMessage("the session query parameter is required")
        live = engine.held_session(session_id, user_id)
        engine.open_body(user_id)  # bodies being read count per user
        try:
            body = read_body(request.environ, engine.config.max_message_size,
                             engine.config.body_timeout)
        finally:
            engine.close_body(user_id)
        if live is None:
            live = engine.session_for_body(session_id, user_id, body)
            if live is None:  # another node holds the session and processes the body
                return json_response({"accepted": len(split_body(body))}, 202)
        accepted = deliver_body(engine, live, body)
    except MessageTooLarge as exc:
        if live is not None:
            engine.reject(live, exc)
        return error_response(exc)
    except RequestTimeout as exc:  # the rest of the body is not worth waiting for
        response = error_response(exc)
        response.headers["Connection"] = "close"
        return response
    except ProtoError as exc:
        return error_response(exc)
    return json_response({"accepted": accepted}, 202)


# -- downstream: the streaming response -----------------------------------------------


class HTTPDownstream:
    """A streaming response that is one session's live transport (see the module doc)."""

    kind = "http"
    mimetype = "application/octet-stream"

    def __init__(self, engine: "Engine", live: "LiveSession", last_seq: int | None,
                 environ: dict[str, Any], *, log_connections: bool = False) -> None:
        self.engine = engine
        self.live = live
        self.last_seq = last_seq
        self.environ = environ
        self.sock: socket.socket | None = raw_socket(environ)
        self.log_connections = log_connections
        self.keepalive = max(0.05, min(KEEPALIVE_SECONDS,
                                       engine.config.heartbeat_interval / 1000.0))
        self._event = gevent.event.Event()
        self._final: list[tuple[int, bytes]] = []
        self._closing: tuple[int, str] | None = None
        self._gone = False
        self._attached = False
        self._finished = False
        self._watcher: gevent.Greenlet | None = None

    # -- framing: what subclasses define ------------------------------------------------

    def preamble(self) -> bytes:
        return b""

    def frame(self, seq: int, data: bytes) -> bytes:
        raise NotImplementedError

    def keepalive_frame(self) -> bytes:
        return b""

    def closing_frame(self, code: int, reason: str) -> bytes:
        return b""

    # -- Transport -------------------------------------------------------------------

    def wake(self) -> None:
        self._event.set()

    def close(self, code: int, reason: str) -> None:
        """Take what is pending now (it belongs to this stream), then end the response."""
        if self._closing is not None or self._finished:
            return
        if self.live.transport is self:
            self._final.extend(self.live.take_writable(now_ms()))
        self._closing = (code, reason)
        self._event.set()
        gevent.spawn_later(CLOSE_TIMEOUT, self._cut_if_stuck)

    def _cut_if_stuck(self) -> None:
        if not self._finished and self.sock is not None:
            log.info("%s %s: response did not end within %.0fs of closing; cutting it",
                     self.kind, self.live.id, CLOSE_TIMEOUT)
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- the response ------------------------------------------------------------------

    def response(self, headers: dict[str, str] | None = None) -> Response:
        resp = Response(_Body(self), status=200, mimetype=self.mimetype)
        resp.headers.update(STREAM_HEADERS)
        resp.headers["Proto-Session"] = self.live.id
        if headers:
            resp.headers.update(headers)
        return resp

    def _take(self) -> bytes:
        out = self._final
        self._final = []
        if self.live.transport is self:
            out.extend(self.live.take_writable(now_ms()))
        return b"".join(self.frame(seq, data) for seq, data in out)

    def _pump(self) -> Iterator[bytes]:
        """The response body: attach, then write whatever the session has, as it comes."""
        try:
            self.engine.attach(self.live, self, self.last_seq)
            self._attached = True
            if self.log_connections:
                access_log.info("%s open session=%s user=%s%s", self.kind, self.live.id,
                                self.live.user_id, "" if self.last_seq is None
                                else f" resume last_seq={self.last_seq}")
            self.started()
            chunk = self.preamble() + self._take()
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
                    tail = self._take() + self.closing_frame(*self._closing)
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
        core = self.live.core
        mine = self.live.transport is self
        if mine:
            core.set_in_flight(len(chunk))
        yield chunk
        if mine and self.live.transport is self:
            core.set_in_flight(0)
            if core.has_writable():  # e.g. a RESUME_CHANNEL the drained buffer queued
                self._event.set()

    def started(self) -> None:
        """Attached and about to write; the stream starts its body reader here."""
        self.watch_peer()

    def watch_peer(self) -> None:
        """Once nothing else reads the socket: notice the client closing it."""
        if self.sock is not None and self._watcher is None and not self._finished:
            self._watcher = gevent.spawn(self._watch_peer)

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
        try:
            if self._attached:
                self.engine.detach(self.live, self)
        finally:
            self.engine.close_connection(self.kind, self.live.user_id)
            if self.log_connections:
                access_log.info("%s closed session=%s", self.kind, self.live.id)

    def after_response(self) -> None:
        """Called once the server wrote the end of the response."""


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
