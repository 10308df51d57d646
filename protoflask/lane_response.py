"""The writer of a stream the head lane opened (head_lane.py): gunicorn's response writer,
its head sent with the first chunk (``LaneResponse``), or the same bytes written without
gunicorn's ``Response`` (``LeanResponse``); and gunicorn's ``wsgi.errors`` with its logger
looked up once (``LaneErrors``). Apart from head_lane.py, which reads the heads, for room
(no file over 500 lines)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from gunicorn.http import wsgi as gunicorn_wsgi
from gunicorn.http.wsgi import HEADER_VALUE_RE, SERVER, STATUS_RE, Response, WSGIErrorsWrapper
from gunicorn.util import hop_headers, http_date, reraise

from .transports.sockets import immediate_send

__all__ = ["LaneErrors", "LaneResponse", "LeanResponse", "date_line"]


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


def connection_token(response: Any) -> str:
    """The Connection header's value gunicorn's ``default_headers`` gives ``response``
    (a ``Response`` or a ``LeanResponse``)."""
    if response.upgrade:
        return "upgrade"
    return "close" if response.should_close() else "keep-alive"


class LaneResponse(Response):
    """gunicorn's response writer, its head sent with the first body bytes: one write
    where gunicorn makes two (the bytes are the same). A stream's first chunk (its
    ``session`` event, or the HELLO reply line) is ready when the head is."""

    _held = b""
    headers_sent: bool  # gunicorn's (untyped)

    def default_headers(self) -> list[str]:
        """gunicorn's (``Response.default_headers``), its Date line made once a second
        (gunicorn formats it for every response: ~8 us here)."""
        connection = connection_token(self)
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
            try:
                kept = passed.get(pair) if hashable else None
            except TypeError:  # (a list or the like inside: gunicorn refuses it below)
                hashable, kept = False, None
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
        send_bytes(self.sock, data, self.send_at_once)

    def write(self, arg: bytes) -> None:
        super().write(arg)
        self.flush_head()

    def close(self) -> None:
        self.send_headers()
        self.flush_head()
        super().close()


def send_bytes(sock: Any, data: bytes, at_once: bool) -> None:
    """``data`` on ``sock``: tried at once on its descriptor (``at_once``), what that did
    not take through the socket's ``sendall``; or ``sendall`` alone."""
    send = immediate_send(sock) if at_once else None
    if send is not None:
        try:
            sent = send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        sock.sendall(memoryview(data)[sent:])
        return
    sock.sendall(data)


#: header name -> True for a name gunicorn's ``process_headers`` passes through when its
#: value is valid (a token, not Content-Length, not hop-by-hop), False for the others
_NAMES: dict[Any, bool] = {}
#: (name, value) -> its head line, for the pairs passed as they are and seen twice in a
#: row for their name (a stream's Proto-Session, new each time, never is); at most
#: PAIRS_MAX kept
_PAIRS: dict[tuple[str, str], str] = {}
PAIRS_MAX = 256
_last: dict[str, str] = {}  # a passed name's last value
_http_cfgs: list[Any] = [None]  # the last config whose protocol was read and is "http"


class LeanResponse:
    """A lane stream's writer without gunicorn's ``Response``: what gunicorn's writer
    does for one request (its checks of the status and the headers, its Connection,
    chunked framing and length rules, ``should_close``), the bytes ``LaneResponse``
    writes (the head with the first body bytes), with the attributes gunicorn's access
    log and worker read (``status``, ``headers``, ``sent``, ``headers_sent``...). A
    header whose name it knows as passed is checked for its value alone (gunicorn's
    regular expression); any other goes through gunicorn's own ``process_headers``.
    tests/test_head_lane.py holds the bytes, headers and refusals equal to gunicorn's."""

    version = SERVER
    status: str | None = None
    status_code: int | None = None
    headers_sent = False
    response_length: int | None = None
    sent = 0
    chunked = False
    must_close = False
    upgrade = False
    _omits_body = False
    _omits_body_warned = False
    _held = b""
    _lines: list[str] | None = None  # the head's lines of ``headers``, made with them
    send_at_once = True  # as LaneResponse's

    def __init__(self, req: Any, sock: Any, cfg: Any) -> None:
        self.req = req
        self.sock = sock
        self.cfg = cfg
        self.headers: list[tuple[str, str]] = []

    def force_close(self) -> None:
        self.must_close = True

    # gunicorn's Response.should_close and process_headers, verbatim
    should_close = Response.should_close
    _gunicorn_process_headers = Response.process_headers

    def start_response(self, status: str, headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Any:
        if exc_info:
            try:
                if self.status and self.headers_sent:
                    reraise(exc_info[0], exc_info[1], exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("Response headers already set!")
        if status == "200 OK" and status.__class__ is str:
            self.status, self.status_code = status, 200
        else:
            if not isinstance(status, str):
                raise TypeError('%r is not a string' % status)
            if not STATUS_RE.fullmatch(status):
                raise ValueError('Invalid status %r' % status)
            self.status = status
            try:
                self.status_code = int(status.split()[0])
            except ValueError:
                self.status_code = None
        self.process_headers(headers)
        code = self.status_code
        if code is not None and (code in (204, 304) or 100 <= code < 200) \
                or self.req.method == "HEAD":
            self._omits_body = True
            if code == 204 or code is not None and 100 <= code < 200:
                self.headers = [(k, v) for k, v in self.headers
                                if k.lower() != "content-length"]
                self._lines = None  # (made from the headers left)
                self.response_length = None
        cfg = self.cfg
        if cfg is not _http_cfgs[0]:
            if getattr(cfg, "protocol", "http") == "uwsgi":
                return self.write  # (not chunked)
            _http_cfgs[0] = cfg
        self.chunked = self.response_length is None and self.req.version > (1, 0) \
            and not self._omits_body
        return self.write

    def process_headers(self, headers: list[tuple[str, str]]) -> None:
        """gunicorn's ``process_headers``: a pair seen twice in a row for its name kept
        with its head line (appended at once), a pair whose name is known as passed
        checked for its value only (the same test, the same refusal), any other by
        gunicorn; each appended pair's head line made here."""
        names, pairs, out = _NAMES, _PAIRS, self.headers
        lines: list[str] = []
        # (a second start_response, with exc_info, adds to the first's headers as
        # gunicorn's does: the head's lines are then made from them all)
        self._lines = lines if not out else None
        for pair in headers:
            if pair.__class__ is tuple:
                try:
                    line = pairs.get(pair)
                except TypeError:  # (an unhashable value: gunicorn refuses it below)
                    line = None
                if line is not None:
                    out.append(pair)
                    lines.append(line)
                    continue
                if len(pair) == 2:
                    name, value = pair
                    if name.__class__ is str and value.__class__ is str and names.get(name):
                        if not HEADER_VALUE_RE.fullmatch(value):
                            raise gunicorn_wsgi.InvalidResponseHeader('%r' % name)
                        stripped = value.strip(" \t")
                        out.append((name, stripped))
                        line = "%s: %s\r\n" % (name, stripped)
                        lines.append(line)
                        if stripped == value:
                            if _last.get(name) == value:
                                if len(pairs) < PAIRS_MAX:
                                    pairs[pair] = line
                            else:
                                _last[name] = value
                        continue
            before = len(out)
            self._gunicorn_process_headers([pair])
            lines.extend(["%s: %s\r\n" % kv for kv in out[before:]])
            name = pair[0]
            if name.__class__ is str and name not in names and len(names) < 256:
                names[name] = len(out) == before + 1 and name.lower() not in _NOT_PASSED \
                    and name.strip() == name

    def _head(self) -> bytes:
        """gunicorn's ``default_headers`` and ``send_headers``' lines (the Date made once
        a second)."""
        connection = connection_token(self)
        version = self.req.version
        lines = self._lines
        if lines is None:
            lines = ["%s: %s\r\n" % kv for kv in self.headers]
        return ("HTTP/%s.%s %s\r\nServer: %s\r\n%sConnection: %s\r\n%s%s\r\n" % (
            version[0], version[1], self.status, self.version, date_line(), connection,
            "Transfer-Encoding: chunked\r\n" if self.chunked else "", "".join(lines))
            ).encode("latin-1")

    def send_headers(self) -> None:
        if not self.headers_sent:
            self._held = self._head()
            self.headers_sent = True

    def write(self, arg: bytes) -> None:
        """gunicorn's ``Response.write``, the head held for the first body bytes."""
        if not self.headers_sent:
            self._held = self._head()
            self.headers_sent = True
        if arg.__class__ is not bytes and not isinstance(arg, bytes):
            raise TypeError('%r is not a byte' % arg)
        data = b""
        if self._omits_body:
            if arg and not self._omits_body_warned:
                gunicorn_wsgi.log.warning(
                    "WSGI app sent body bytes on a no-body response "
                    "(method=%s status=%s); dropping per RFC 9110.",
                    self.req.method, self.status_code)
                self._omits_body_warned = True
        else:
            tosend = len(arg)
            length = self.response_length
            if length is not None:
                if self.sent >= length:
                    tosend = 0
                    arg = b""
                elif length - self.sent < tosend:
                    tosend = length - self.sent
                    arg = arg[:tosend]
            if self.chunked:
                if tosend:
                    data = b"%X\r\n%s\r\n" % (tosend, arg)
            else:
                data = arg
            self.sent += tosend
        held = self._held
        if held or data:
            self._held = b""
            send_bytes(self.sock, held + data, self.send_at_once)

    def close(self) -> None:
        """gunicorn's ``Response.close``: the head if not sent yet, the last chunk."""
        self.send_headers()
        held, self._held = self._held, b""
        data = held + b"0\r\n\r\n" if self.chunked else held
        if data:
            send_bytes(self.sock, data, self.send_at_once)
