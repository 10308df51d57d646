"""The writer of a stream the head lane opened (head_lane.py): gunicorn's response writer,
its head sent with the first chunk (``LaneResponse``), and gunicorn's ``wsgi.errors``
with its logger looked up once (``LaneErrors``). Apart from head_lane.py, which reads
the heads, for room (no file over 500 lines)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from gunicorn.http.wsgi import Response, WSGIErrorsWrapper
from gunicorn.util import hop_headers, http_date

from .transports.sockets import immediate_send

__all__ = ["LaneErrors", "LaneResponse", "date_line"]


class LaneErrors(WSGIErrorsWrapper):
    """gunicorn's ``wsgi.errors`` (its ``WSGIErrorsWrapper``: the error log's streams as
    they are now), its logger looked up once: ``logging.getLogger`` takes logging's
    module lock, under gevent a lock in Python (~3% of a stream's open). The logger of a
    name is always the same object; its handlers are read at each request as gunicorn
    reads them (a reopened log file is a new stream)."""

    _errorlog: logging.Logger | None = None
    #: (a worker's config, its errorlog setting): a setting is a lookup through gunicorn's
    #: ``Config.__getattr__`` (~1 us), and a worker's config does not change
    _setting: tuple[Any, Any] = (None, None)

    def __init__(self, cfg: Any) -> None:  # gunicorn's, but for the lookups
        errorlog = LaneErrors._errorlog
        if errorlog is None:
            errorlog = LaneErrors._errorlog = logging.getLogger("gunicorn.error")
        setting = LaneErrors._setting
        if setting[0] is not cfg:
            setting = LaneErrors._setting = (cfg, cfg.errorlog)
        handlers = errorlog.handlers
        self.streams = []
        if setting[1] == "-":
            self.streams.append(sys.stderr)
            handlers = handlers[1:]
        for h in handlers:
            if hasattr(h, "stream"):
                self.streams.append(h.stream)


#: the header names gunicorn's ``process_headers`` does more with than append the pair
_NOT_PASSED = frozenset({"content-length", *hop_headers})

_date: list[Any] = [0, ""]  # the second, its Date line


def date_line() -> str:
    """gunicorn's Date line (``util.http_date``) for this second."""
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, "Date: %s\r\n" % http_date(now)]
    return str(_date[1])


class LaneResponse(Response):
    """gunicorn's response writer, its head sent with the first body bytes: one write
    where gunicorn makes two (the bytes are the same). A stream's first chunk (its
    ``session`` event, or the HELLO reply line) is ready when the head is."""

    _held = b""
    headers_sent: bool  # gunicorn's (untyped)

    def default_headers(self) -> list[str]:
        """gunicorn's (``Response.default_headers``), its Date line made once a second
        (gunicorn formats it for every response: ~8 us here)."""
        if self.upgrade:
            connection = "upgrade"
        elif self.should_close():
            connection = "close"
        else:
            connection = "keep-alive"
        lines = ["HTTP/%s.%s %s\r\n" % (self.req.version[0], self.req.version[1], self.status),
                 "Server: %s\r\n" % self.version, date_line(),
                 "Connection: %s\r\n" % connection]
        if self.chunked:
            lines.append("Transfer-Encoding: chunked\r\n")
        return lines

    #: The swap point of ``process_headers``: gunicorn's checks of a header remembered
    #: for the pairs they only pass through (a stream's headers are the same but for its
    #: Proto-Session), or with False gunicorn's on every pair
    #: (tests/test_head_lane.py holds them equal, refusals included).
    remember_headers = True
    #: (name, value) -> what gunicorn's ``process_headers`` appends for it, for the pairs
    #: it appends as they are and nothing else (not Content-Length, no hop-by-hop)
    _passed: dict[tuple[str, str], tuple[str, str]] = {}
    PASSED_MAX = 512

    def process_headers(self, headers: list[tuple[str, str]]) -> None:
        """gunicorn's, one pair at a time, a pair it passed before appended at once
        (its checks are two regular expressions, a strip and two lower-casings a header:
        ~0.8 us, ten of them in a stream's head with CORS)."""
        if not self.remember_headers:
            return super().process_headers(headers)
        passed, out = self._passed, self.headers
        for pair in headers:
            hashable = pair.__class__ is tuple
            kept = passed.get(pair) if hashable else None
            if kept is not None:
                out.append(kept)
                continue
            before = len(out)
            super().process_headers([pair])
            if hashable and len(out) == before + 1 and pair[0].lower() not in _NOT_PASSED:
                if len(passed) >= self.PASSED_MAX:
                    passed.clear()
                passed[pair] = out[-1]

    #: The swap point of ``is_chunked``: gunicorn's, its ``protocol`` setting read once per
    #: worker config (a failed attribute lookup before ``Config.__getattr__``, ~1 us a
    #: stream), or with False gunicorn's on every response (tests/test_head_lane.py holds
    #: the bytes written equal)
    remember_settings = True
    _http_cfg: Any = None  # the config whose protocol was read and is not uwsgi

    def is_chunked(self) -> bool:
        """gunicorn's (``Response.is_chunked``): no chunks for a uwsgi protocol, a known
        length, HTTP/1.0 or a response without a body."""
        cfg = self.cfg
        if cfg is not LaneResponse._http_cfg or not self.remember_settings:
            if not self.remember_settings or getattr(cfg, "protocol", "http") == "uwsgi":
                return bool(super().is_chunked())
            LaneResponse._http_cfg = cfg
        return self.response_length is None and self.req.version > (1, 0) \
            and not self._omits_body

    def send_headers(self) -> None:
        """gunicorn's ``send_headers``, the head held for the first body write."""
        if self.headers_sent:
            return
        lines = self.default_headers()
        lines.extend(["%s: %s\r\n" % (k, v) for k, v in self.headers])
        self._held = ("%s\r\n" % "".join(lines)).encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data: bytes) -> None:
        held, self._held = self._held, b""
        if self.chunked:  # gunicorn's util.write_chunk
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self._send(held + data)

    def flush_head(self) -> None:
        """Send a head still held (a write that carried no body bytes: gunicorn sends the
        head then, and so does this)."""
        if self._held:
            held, self._held = self._held, b""
            self._send(held)

    #: The swap point of a write: tried at once on the socket's descriptor
    #: (``sockets.immediate_send``), what it did not take through the socket's
    #: ``sendall``; or with False ``sendall`` alone, as gunicorn writes. gevent's
    #: ``sendall`` asks the kernel for the send buffer's size first, a syscall a write.
    #: tests/test_head_lane.py holds the bytes equal, a write larger than the buffer too.
    send_at_once = True

    def _send(self, data: bytes) -> None:
        send = immediate_send(self.sock) if self.send_at_once else None
        if send is not None:
            try:
                sent = send(data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            self.sock.sendall(memoryview(data)[sent:])
            return
        self.sock.sendall(data)

    def write(self, arg: bytes) -> None:
        super().write(arg)
        self.flush_head()

    def close(self) -> None:
        self.send_headers()
        self.flush_head()
        super().close()
