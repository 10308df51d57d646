"""Request bodies off the WSGI input: a POST body read whole (bounded in size and time),
and a duplex stream's body as it arrives, piece by piece and line by line, under
gevent.pywsgi or gunicorn. Bytes only: what the bytes mean is the core's
(``core.bodies``) and the session's."""

from __future__ import annotations

import io
from time import monotonic
from typing import Any, Callable, Iterable, Iterator

import gevent

from ..core.errors import MessageTooLarge, RequestTimeout
from ..turns import give_turn

#: Largest piece read from a request body at once.
PIECE_SIZE = 65536


#: An oversized body up to this size in all is read to its end (and dropped) before the
#: 413 goes out: a proxy or client still sending it would otherwise meet a reset
#: connection and report that (nginx: a 502) instead of the 413. A larger one is cut.
DISCARD_LIMIT = 16 * 1024 * 1024


def read_body(environ: dict[str, Any], limit: int, timeout_ms: int | None = None) -> bytes:
    """The whole request body, or MessageTooLarge once it passes ``limit`` bytes, or
    RequestTimeout (408) when it has not all arrived within ``timeout_ms`` (bodyTimeout:
    a client trickling its body must not hold a connection and a greenlet forever)."""
    length = environ.get("CONTENT_LENGTH") or ""
    inp = environ["wsgi.input"]
    parts: list[bytes] = []
    total = 0
    deadline = gevent.Timeout.start_new(
        timeout_ms / 1000.0, RequestTimeout(f"the request body did not arrive within "
                                            f"bodyTimeout ({timeout_ms} ms)")) \
        if timeout_ms else None
    try:
        if length.isdigit() and int(length) > limit:
            _discard(inp, 0, int(length))
            raise MessageTooLarge(f"body of {length} bytes exceeds maxMessageSize ({limit})")
        while True:
            data = inp.read(min(PIECE_SIZE, limit + 1 - total))
            if not data:
                return b"".join(parts)
            total += len(data)
            if total > limit:
                _discard(inp, total, None)
                raise MessageTooLarge(f"body exceeds maxMessageSize ({limit} bytes)")
            parts.append(data)
    finally:
        if deadline is not None:
            deadline.close()


def _discard(inp: Any, read: int, length: int | None) -> None:
    """Read the rest of an oversized body and drop it, unless it is (or grows) larger
    than DISCARD_LIMIT in all; ``length``: its Content-Length, when it has one."""
    if length is not None and length > DISCARD_LIMIT:
        return
    while read <= DISCARD_LIMIT:
        data = inp.read(PIECE_SIZE)
        if not data:
            return
        read += len(data)


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


def taking_turns(pieces: Iterable[bytes],
                 took: Callable[[float], None] | None = None) -> Iterator[bytes]:
    """The pieces, with a turn for every other greenlet before each is handed on.

    gevent switches greenlets only when a read has to wait. A client that streams its
    body without a pause leaves bytes for every read, so without this the worker would
    serve that one stream alone: not its own downstream, not a new connection, not
    ``/health`` (tests/integration/test_reader_fairness.py). One hub turn per piece (a
    chunk, or up to PIECE_SIZE bytes) is a few microseconds per many lines. With
    ``took`` (the user's ``turns.Pacer.took``), the time the caller spent on the last
    piece's lines is told to it, and it gives the turn (or the user's pause); the last
    piece's once the body has ended, so that a body of one costly piece is paced too."""
    spent = 0.0
    for piece in pieces:
        if took is None:
            give_turn()
        else:
            took(spent)
        started = monotonic()
        yield piece
        spent = monotonic() - started
    if took is not None:
        took(spent)


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
    pieces. A line longer than ``limit`` raises MessageTooLarge once ``limit + 1`` of its
    bytes are in (no more of it is kept). With ``stall_ms`` (bodyTimeout), a partial line
    whose next piece does not come within it raises RequestTimeout; waiting between lines
    has no deadline (an idle duplex stream)."""
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
                raise _line_too_long(limit)
            if line:
                yield line
        del buf[:start]
        if len(buf) > limit + 1:
            raise _line_too_long(limit)
    line = bytes(buf).strip()
    if len(line) > limit:
        raise _line_too_long(limit)
    if line:
        yield line


def _line_too_long(limit: int) -> MessageTooLarge:
    # The size is what was read of the line when it was refused: the rest is never read.
    return MessageTooLarge(f"message of {limit + 1} bytes exceeds {limit}")
