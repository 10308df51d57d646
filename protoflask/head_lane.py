"""The request heads of a reconnect storm read without gunicorn's HTTP parser (issue 29).

A storm is thousands of one-request connections: ``GET /proto/websocket``, ``GET
/proto/sse``, an opening ``POST /proto/stream``. gunicorn's parser (its header policy,
body readers and unreader) and its WSGI environ cost about a quarter of a WebSocket
handshake (docs/PERFORMANCE.md, p7-storm). protoflask's gunicorn worker
(``gunicorn_worker.GeventWorker.handle``) peeks at a new connection's first bytes
(``MSG_PEEK``: nothing is taken off the socket until the lane is sure) and, when they
are one whole request head of those three and nothing else, reads it here:

- ``GET /proto/websocket``: a small environ (what ``post_lane.py`` and the handshake
  read) straight to ``SessionPostLane.upgrade``; admitted, the head is taken off the
  socket and the WebSocket served apart as the route serves it, on the socket itself
  (detached: not a duplicate, as the request's server keeps none of it). Refused, nothing was
  taken: the refusal is left with ``post_lane`` for that socket and gunicorn's own path
  reads the same head and answers it as before (counted once, a ticket spent once).
- ``GET /proto/sse`` and the opening ``POST /proto/stream`` (new, or resumed with
  ``last_seq``): the environ with the body read with the head, straight to
  ``SessionPostLane.open`` (only what the open and the stream read of it where
  gunicorn's access log, which reads every key, is off); the stream's response written as
  gunicorn's writer writes it (``LeanResponse``, or gunicorn's own as ``LaneResponse``:
  its head sent with the first chunk, one write where gunicorn makes two), its access log
  line and errors as gunicorn's ``handle_request`` has them
  (``gunicorn_worker.GeventWorker._serve_stream``). A refusal is left as the upgrade's.

Anything else is left on the socket for gunicorn: another path or method (a session's
POST batch to ``/proto/stream`` included), HTTP/1.0, a
head not whole in the first read or with bytes after it (pipelining) or a body it does
not carry in full, a head over the configured limits (gunicorn answers 414 / 431), one
gunicorn would refuse (400: a bad token, control bytes, a bare LF, obsolete folding), a
repeated header, a header with "_" (gunicorn drops or refuses those), Expect,
Transfer-Encoding, a forwarded-scheme header (``secure_scheme_headers``), non-ASCII
bytes. ``tests/test_head_lane.py`` holds the heads read here to gunicorn's parser
(equal fields and environ) and the answers to gunicorn's (byte for byte).
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any, NamedTuple

import gevent.socket
from gunicorn.http.body import Body, LengthReader
from gunicorn.http.unreader import IterUnreader
from gunicorn.http.wsgi import WSGIErrorsWrapper, base_environ

from .lane_response import LaneErrors, LaneResponse, LeanResponse
from .transports.stream import CARRIED_BODY
from .post_lane import SSE_PATH, STREAM_PATH, WEBSOCKET_PATH, SessionPostLane, plain_query
from .web import REFUSED_KEY

__all__ = ["HeadLane", "HeadRequest", "LANE_HEAD_MAX", "LaneErrors", "LaneResponse",
           "LeanResponse", "environ_for", "handshake_of", "lane_config_ok", "parse_head",
           "stream_environ", "upgrade_environ"]

#: At most this many bytes are peeked, and a head (with its body) must fit in them.
LANE_HEAD_MAX = 8192
#: A body the lane carries in full (an opening stream's HELLO); longer ones go to gunicorn
LANE_BODY_MAX = 4096
#: (method, path) the lane reads; whether the request carries a body
LANE_TARGETS = {("GET", WEBSOCKET_PATH): False, ("GET", SSE_PATH): False,
                ("POST", STREAM_PATH): True}
#: gunicorn's RFC 9110 token, its forbidden request-target and field-value bytes
#: (gunicorn/http/message.py: TOKEN_RE, RFC9112_TARGET_INVALID,
#: RFC9110_5_5_INVALID_AND_DANGEROUS), the lane's subset: "_" is refused too
_TOKEN = r"[!#$%&'*+\-.^`|~0-9a-zA-Z]+"
_VALUE = r"[^\x00-\x08\x0a-\x1f\x7f]*"
#: a head's header lines (CRLF between them): each a _TOKEN, a colon and a _VALUE (CR
#: and LF are not in one, so no line runs into the next): every line checked in one match
_FIELDS = re.compile(f"{_TOKEN}:{_VALUE}(?:\r\n{_TOKEN}:{_VALUE})*")
#: headers whose meaning in gunicorn the lane does not reproduce
_REFUSED_NAMES = frozenset({"EXPECT", "TRANSFER-ENCODING", "HTTP2-SETTINGS", "TE", "TRAILER"})


class HeadRequest:
    """What gunicorn's ``Request`` is to its worker (``handle_request``, ``wsgi.create``,
    ``Response``, the access log), for a head the lane read."""

    __slots__ = ("method", "uri", "path", "query", "fragment", "version", "headers",
                 "_body", "_raw_body", "scheme", "raw_length", "content_length", "must_close",
                 "is_upgrade")

    proxy_protocol_info = None
    _expected_100_continue = False
    trailers: tuple[tuple[str, str], ...] = ()

    def __init__(self, method: str, uri: str, path: str, query: str,
                 headers: list[tuple[str, str]], raw_length: int, content_length: int,
                 scheme: str) -> None:
        self.method, self.uri, self.path, self.query = method, uri, path, query
        self.fragment = ""
        self.version = (1, 1)
        self.headers = headers
        self.scheme = scheme
        self.raw_length = raw_length  # head and body, as taken off the socket
        self.content_length = content_length
        self.must_close = False
        self._body: Any = None
        self._raw_body: bytes | None = None
        #: ``GET /proto/websocket``, which the lane serves itself (``HeadLane.upgrade``)
        self.is_upgrade = path == WEBSOCKET_PATH

    def carry_body(self, body: bytes) -> None:
        """The body (read with the head) as gunicorn's reader of a known length (gunicorn
        gives a request without one a reader of 0 bytes), made when first read (``body``:
        an upgrade's never is, and gunicorn's reader costs ~2.5 us to make)."""
        self._raw_body, self._body = body, None

    @property
    def body(self) -> Any:
        if self._body is None and self._raw_body is not None:
            body = self._raw_body
            self._body = Body(LengthReader(IterUnreader([body] if body else []),
                                           self.content_length))
        return self._body

    @property
    def carried(self) -> bytes:
        """The body's bytes, read with the head (empty for a request without one)."""
        return self._raw_body or b""

    def should_close(self) -> bool:
        """gunicorn's ``Message.should_close`` for an HTTP/1.1 request."""
        if self.must_close:
            return True
        for name, value in self.headers:
            if name == "CONNECTION":
                value = value.lower().strip(" \t")
                if value == "close":
                    return True
                return False
        return False

    def force_close(self) -> None:
        self.must_close = True


def lane_config_ok(cfg: Any) -> bool:
    """Whether gunicorn is configured so that its parser would read a lane head as the lane
    does: plain HTTP/1.1 over TCP without TLS, PROXY protocol or HTTP/2, no request hooks
    of the application's, gunicorn's own header rules, and a keep-alive timeout (the one
    bound on a head's arrival, which the lane keeps)."""
    settings = cfg.settings
    return (not cfg.is_ssl and str(getattr(cfg, "proxy_protocol", "off")) in ("off", "False")
            and getattr(cfg, "http2_cleartext", "off") in ("off", None)
            and getattr(cfg, "protocol", "http") == "http"
            and cfg.keepalive > 0 and not cfg.strip_header_spaces
            and not cfg.casefold_http_method
            and settings["pre_request"].value is settings["pre_request"].default
            and settings["post_request"].value is settings["post_request"].default
            and not os.environ.get("SCRIPT_NAME"))


class HeadLimits(NamedTuple):
    """What of gunicorn's settings a head is checked against (read once: a setting is a
    lookup of ~1 µs)."""

    line: int  # limit_request_line (0: none)
    field: int  # limit_request_field_size (0: none)
    fields: int  # limit_request_fields (0: none)
    scheme_headers: frozenset[str]  # secure_scheme_headers' names: gunicorn's, not the lane's

    @classmethod
    def of(cls, cfg: Any) -> HeadLimits:
        return cls(cfg.limit_request_line, cfg.limit_request_field_size,
                   cfg.limit_request_fields, frozenset(cfg.secure_scheme_headers))


def parse_head(data: bytes, limits: HeadLimits) -> HeadRequest | None:
    """The request in ``data`` (the bytes peeked from a new connection), or None when the
    lane leaves it to gunicorn (the module doc says when)."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or not data.isascii():
        return None
    text = data[:end].decode("ascii")
    request_end = text.find("\r\n")
    request_line = text[:request_end] if request_end >= 0 else text
    if 0 < limits.line <= len(request_line) or request_line.count(" ") != 2:
        return None
    method, uri, version = request_line.split(" ")
    path, _, query = uri.partition("?")
    has_body = LANE_TARGETS.get((method, path))
    # printable ASCII, no space (split on it) and no fragment: gunicorn's target rule
    if has_body is None or version != "HTTP/1.1" or not uri.isprintable() or "#" in uri:
        return None
    field_limit = limits.field
    lines = text[request_end + 2:].split("\r\n") if request_end >= 0 else []
    if len(lines) > limits.fields > 0 \
            or lines and not _FIELDS.fullmatch(text, request_end + 2):
        return None  # an empty line, obsolete folding and bad names or values included
    scheme_headers = limits.scheme_headers
    headers: list[tuple[str, str]] = []
    names: set[str] = set()
    content_length = -1
    for line in lines:
        name, _, value = line.partition(":")
        if field_limit > 0 and len(line) + 2 > field_limit:
            return None
        name = name.upper()
        if name in names or name in _REFUSED_NAMES or name in scheme_headers:
            return None
        names.add(name)
        value = value.strip(" \t")
        if name == "CONTENT-LENGTH":
            if not has_body or not value.isdigit() or len(value) > 5:
                return None
            content_length = int(value)
        headers.append((name, value))
    body_start = end + 4
    if has_body:
        if not 0 <= content_length <= LANE_BODY_MAX \
                or len(data) != body_start + content_length:
            return None
    elif len(data) != body_start:
        return None
    head = HeadRequest(method, uri, path, query, headers, len(data), max(content_length, 0),
                       "http")
    head.carry_body(data[body_start:])
    return head


class LazyInput:
    """A head's ``wsgi.input``: its ``body`` (gunicorn's reader of the carried bytes, ~2.5 us
    to make), made when first used. Every attribute is the reader's."""

    __slots__ = ("_head",)

    def __init__(self, head: HeadRequest) -> None:
        self._head = head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._head.body, name)

    def __iter__(self) -> Any:
        return iter(self._head.body)


def environ_for(head: HeadRequest, sock: Any, addr: tuple[Any, ...],
                server: tuple[Any, ...]) -> dict[str, Any]:
    """The WSGI environ gunicorn's ``wsgi.create`` builds for ``head``, but for what no
    reader of an upgrade's environ uses: ``wsgi.errors`` (a wrapper of the error log's
    streams, made per request), ``wsgi.early_hints`` and ``wsgi.input`` (a GET has no
    body)."""
    environ = {**BASE_ENVIRON, "gunicorn.socket": sock, "REQUEST_METHOD": head.method,
               "QUERY_STRING": head.query, "RAW_URI": head.uri,
               "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": head.scheme,
               "REMOTE_ADDR": addr[0], "REMOTE_PORT": str(addr[1]),
               "SERVER_NAME": server[0], "SERVER_PORT": str(server[1]),
               "PATH_INFO": head.path, "SCRIPT_NAME": ""}
    put_headers(environ, head.headers)
    return environ


def put_headers(environ: dict[str, Any], headers: Any) -> None:
    """The head's fields as gunicorn's ``wsgi.create`` puts them in an environ."""
    keys = _ENVIRON_KEYS
    for name, value in headers:
        if name == "CONTENT-TYPE":
            environ["CONTENT_TYPE"] = value
        elif name == "CONTENT-LENGTH":
            environ["CONTENT_LENGTH"] = value
        else:
            environ[keys.get(name) or environ_key(name)] = value


#: a header's environ key by its name (``HTTP_`` and "-" as "_"), at most 256 kept
_ENVIRON_KEYS: dict[str, str] = {}


def environ_key(name: str) -> str:
    """``"HTTP_" + name.replace("-", "_")``, remembered for the names a worker sees."""
    key = _ENVIRON_KEYS.get(name)
    if key is None:
        key = "HTTP_" + name.replace("-", "_")
        if len(_ENVIRON_KEYS) < 256:
            _ENVIRON_KEYS[name] = key
    return key


def handshake_of(head: HeadRequest) -> dict[str, Any]:
    """What ``web.serve_apart`` keeps of an upgrade's environ for the handshake (its
    ``HTTP_`` keys, ``PATH_INFO`` and ``QUERY_STRING``, in the environ's order), made from
    the head rather than filtered out of ``environ_for``'s whole environ."""
    handshake = {"QUERY_STRING": head.query, "PATH_INFO": head.path}
    keys = _ENVIRON_KEYS
    for name, value in head.headers:
        if name != "CONTENT-TYPE" and name != "CONTENT-LENGTH":
            handshake[keys.get(name) or environ_key(name)] = value
    return handshake


def upgrade_environ(handshake: dict[str, Any], head: HeadRequest, sock: Any
                    ) -> dict[str, Any]:
    """An upgrade's environ as far as ``SessionPostLane.upgrade`` reads it (the socket, the
    method, the query, the headers): each key's value is ``environ_for``'s. Never handed
    to Flask: a refused upgrade is read again by gunicorn."""
    environ = dict(handshake)
    environ["gunicorn.socket"] = sock
    environ["REQUEST_METHOD"] = head.method
    return environ


def stream_environ(head: HeadRequest, sock: Any) -> dict[str, Any]:
    """A stream open's environ as far as ``SessionPostLane.open`` and the stream read it
    (the socket, the method, the path and query, the headers, the body's length and
    type): each key's value is ``environ_for``'s. Only where nothing else reads it:
    gunicorn's access log (which reads every key) off, and the app plain (``open``)."""
    environ = {"gunicorn.socket": sock, "REQUEST_METHOD": head.method,
               "QUERY_STRING": head.query, "PATH_INFO": head.path}
    put_headers(environ, head.headers)
    return environ


#: gunicorn's ``base_environ`` less ``wsgi.errors``, set by the worker at start-up
BASE_ENVIRON: dict[str, Any] = {}


def set_base_environ(cfg: Any) -> None:
    """gunicorn's base environ for this worker's configuration (``wsgi.multithread`` True,
    as its async workers set it), without ``wsgi.errors``."""
    environ = base_environ(cfg)
    environ.pop("wsgi.errors", None)
    environ["wsgi.multithread"] = True
    BASE_ENVIRON.clear()
    BASE_ENVIRON.update(environ)


class HeadLane:
    """One worker's lane: the ``SessionPostLane`` of its app and gunicorn's settings."""

    #: The swap point of a stream's ``wsgi.errors``: ``LaneErrors``, or with False
    #: gunicorn's ``WSGIErrorsWrapper`` (tests/test_head_lane.py holds their streams equal)
    lane_errors = True
    #: The swap point of a stream's ``wsgi.input``: ``LazyInput`` (gunicorn's reader made
    #: on its first use: an SSE stream and a stream with its body carried never read it),
    #: or with False gunicorn's reader made at the open (tests/test_head_lane.py holds
    #: what they read equal)
    lazy_input = True
    #: The swap point of an upgrade's environ: only what the upgrade reads
    #: (``upgrade_environ``) with the handshake's headers made from the head
    #: (``handshake_of``), or with False gunicorn's whole environ (``environ_for``), the
    #: handshake filtered out of it by ``web.serve_apart`` (tests/test_head_lane.py holds
    #: them equal)
    lean_upgrade = True
    #: The swap point of a stream open's environ: where nothing but the stream reads it
    #: (``open(whole=False)``: gunicorn's access log off), only what the open and the
    #: stream read (``stream_environ``), without ``wsgi.errors``; or with False always
    #: gunicorn's whole environ (``environ_for``). tests/test_head_lane.py holds what they
    #: hand the open equal.
    lean_open = True
    #: The swap point of a stream's writer: ``LeanResponse`` (no gunicorn ``Response``),
    #: or with False ``LaneResponse`` (gunicorn's, its head held for the first chunk);
    #: tests/test_head_lane.py and tests/integration/test_head_lane.py hold the bytes equal.
    lean_response = True
    #: The swap point of the peek: first tried on a gevent socket's non-blocking descriptor
    #: (the head is most often there already), waiting (gevent's ``recv`` under the
    #: socket's timeout, set and set back) only when it is not; or with False always the
    #: waiting way. ``take_off`` too reads the peeked head off the descriptor at once.
    #: (tests/test_head_lane.py runs the peek's and the take-off's tests both ways)
    peek_at_once = True

    def __init__(self, post_lane: SessionPostLane, cfg: Any) -> None:
        self.post_lane = post_lane
        self.cfg = cfg
        self.limits = HeadLimits.of(cfg)
        set_base_environ(cfg)
        #: each listener's address (gunicorn asks the socket for it on every request)
        self._servers: dict[Any, Any] = {}

    def server_of(self, listener: Any) -> Any:
        server = self._servers.get(listener)
        if server is None:
            server = self._servers[listener] = listener.getsockname()
        return server

    def peek(self, client: Any, timeout: float) -> bytes:
        """The connection's first bytes, left on the socket (b"" when nothing came within
        ``timeout`` or the client left: gunicorn's read would close it then too)."""
        if self.peek_at_once and type(client) is gevent.socket.socket:
            try:  # the descriptor is non-blocking: the head, or BlockingIOError at once
                return client._sock.recv(LANE_HEAD_MAX, socket.MSG_PEEK)
            except BlockingIOError:
                pass  # not there yet: wait for it below
            except OSError:
                return b""  # (a reset: gevent's recv raises the same)
        data = b""
        # the socket's own timeout, not a gevent.Timeout around the call: gevent makes
        # one only if the read has to wait (the head is most often there already)
        client.settimeout(timeout)
        try:
            data = client.recv(LANE_HEAD_MAX, socket.MSG_PEEK)
        except OSError:  # socket.timeout among them
            pass
        finally:
            client.settimeout(None)  # blocking again, as the worker set it
        return data

    def read(self, data: bytes, addr: Any, listener: Any) -> HeadRequest | None:
        """The lane's request in ``data``, or None for gunicorn's parser."""
        if not isinstance(addr, tuple) or not isinstance(self.server_of(listener), tuple):
            return None  # a Unix socket: gunicorn builds its SERVER_* otherwise
        return parse_head(data, self.limits)

    def upgrade(self, head: HeadRequest, client: Any, addr: Any, listener: Any) -> bool:
        """``GET /proto/websocket``: True once admitted and served apart (the head taken off
        the socket); False for gunicorn's path, with a refusal left for ``post_lane``."""
        if self.lean_upgrade:
            handshake: dict[str, Any] | None = handshake_of(head)
            assert handshake is not None
            environ = upgrade_environ(handshake, head, client)
        else:
            handshake = None
            environ = environ_for(head, client, addr, self.server_of(listener))
        # once admitted, the head is taken off and the socket handed over
        if self.post_lane.upgrade(environ, lambda: self.take_off(client, head), handshake):
            return True
        refused = environ.pop(REFUSED_KEY, None)
        if refused is not None:
            self.post_lane.refusals[client] = refused
        return False

    def open(self, head: HeadRequest, client: Any, addr: Any, listener: Any,
             whole: bool = True) -> tuple[dict[str, Any], Any] | None:
        """``GET /proto/sse`` or an opening ``POST /proto/stream``: (its environ, the
        stream's response) once admitted, the head taken off the socket; None for
        gunicorn's path (anything else: a session's POST batch; a refusal, left for
        ``post_lane``). ``whole``: the environ is read by more than the stream (the
        access log): gunicorn's whole environ, else only what the stream reads
        (``lean_open``)."""
        kind = "sse" if head.method == "GET" else "stream"
        args = plain_query(head.query)
        if kind == "stream":
            if args is None or args.get("session") and not args.get("last_seq"):
                return None  # a session's upstream batch, or a query Flask decodes
        lean = not whole and self.lean_open
        environ = stream_environ(head, client) if lean \
            else environ_for(head, client, addr, self.server_of(listener))
        environ["wsgi.input"] = LazyInput(head) if self.lazy_input else head.body
        if kind == "stream":  # the HELLO, handed to the session without a reader greenlet
            environ[CARRIED_BODY] = head.carried
        if not lean:
            environ["wsgi.errors"] = LaneErrors(self.cfg) if self.lane_errors \
                else WSGIErrorsWrapper(self.cfg)
        response = self.post_lane.open(environ, kind, args)  # the query read once
        if response is None:
            refused = environ.pop(REFUSED_KEY, None)
            if refused is not None:
                self.post_lane.refusals[client] = refused
            return None
        self.take_off(client, head)
        return environ, response

    def response(self, head: HeadRequest, client: Any) -> LaneResponse | LeanResponse:
        if self.lean_response:
            return LeanResponse(head, client, self.cfg)
        return LaneResponse(head, client, self.cfg)

    @classmethod
    def take_off(cls, client: Any, head: HeadRequest) -> None:
        """Take the head (with its body) off the socket, where it was peeked whole: at
        once from a gevent socket's descriptor (the bytes are there: peeked), else (and
        for what that did not take) through the socket's ``recv``."""
        length = head.raw_length
        if cls.peek_at_once and type(client) is gevent.socket.socket:
            try:
                length -= len(client._sock.recv(length))
            except BlockingIOError:
                pass
        while length > 0:
            got = len(client.recv(length))
            if not got:
                return
            length -= got

    def forget(self, client: Any) -> None:
        """A refusal gunicorn's path did not take (it refused the head itself)."""
        if self.post_lane.refusals:
            self.post_lane.refusals.pop(client, None)
