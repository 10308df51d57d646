"""HTTP streaming transport (docs/PROTOCOL-http.md §4): NDJSON both ways on one POST.

    POST /proto/stream                        -> 200 application/x-ndjson, Proto-Session
    POST /proto/stream?session=<id>           -> 202 {"accepted": n}  (follow-up messages)
    POST /proto/stream?session=<id>&last_seq=n -> 200, a resumed stream

The request body is read in its own greenlet, line by line as it arrives (full duplex
while a chunked body keeps coming), and each line goes to the session; the response
writes one envelope per line. The response outlives the request body: it stays open as
the session's downstream until the client goes away or the server ends it. A line over
maxMessageSize gets the core's MESSAGE_TOO_LARGE as its last ERROR line and ends the
response (the session stays for resume).

An NDJSON stream has no room for a keep-alive line (every line is an envelope), so an
idle stream relies on the server's heartbeat PINGs, write failures and the end of the
socket's read side to notice a client that went away.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import gevent
from flask import Request, Response

from ..auth import token_from_request
from ..core.bodies import parse_seq_arg
from ..core.errors import MessageTooLarge, ProtoError, RequestTimeout
from ..turns import COSTLY
from .http import LINGER_SECONDS, HTTPDownstream, error_response, post_messages
from .request_body import body_pieces, iter_lines, taking_turns
from .sockets import shutdown

if TYPE_CHECKING:
    from ..port import Ports

log = logging.getLogger("protoflask.stream")

#: The environ key under which a server that read a request's whole body with its head
#: (protoflask's gunicorn worker, head_lane.py: an opening POST's HELLO) leaves those bytes.
CARRIED_BODY = "protoflask.carried_body"


class NDJSONStream(HTTPDownstream):
    kind = "stream"
    mimetype = "application/x-ndjson"

    _reader: gevent.Greenlet | None = None
    _stalled = False  # the body stalled inside a line: the socket is cut after the response

    def frame(self, seq: int, data: bytes) -> bytes:
        return data + b"\n"

    def frames(self, ready: list[tuple[int, bytes]]) -> bytes:
        return b"\n".join([data for _, data in ready]) + b"\n"

    #: The swap point of a body the server carried whole (``CARRIED_BODY``): its lines
    #: handed to the session in the response's own greenlet before the first write
    #: (``_hand_carried``), rather than read by a greenlet of their own (``_read_body``).
    #: The same lines in the same order; the first write then carries the response's
    #: head and what they answered (the HELLO reply) at once, where the reader's turn
    #: made it two writes. tests/transports/test_stream_carried.py holds them equal.
    hand_carried_body = True
    #: The swap point of the rings while a carried body is handed over: the response's
    #: greenlet is the session's bell's puller then (``Bell.puller``), as it takes what
    #: the lines answered right after (``_pump``'s first take, which sets its own event
    #: if anything is still writable then, as a ring would have). With False every ring
    #: is answered: an event-loop callback and a wake of the response after its first
    #: write, to find nothing (the HELLO reply was in it). tests/transports/
    #: test_stream_carried.py holds the two equal on the wire.
    quiet_hand_over = True

    def started(self) -> None:
        carried = self.environ.get(CARRIED_BODY) if self.hand_carried_body else None
        if carried is not None:
            self._hand_carried(carried)
            return
        self._reader = gevent.spawn(self._read_body)
        # Let the reader make its first read before anything is written: gevent.pywsgi
        # answers ``Expect: 100-continue`` then, and that must precede the response.
        gevent.sleep(0)

    def _read_body(self) -> None:
        """Upstream: each line of the request body, as it arrives, to the session. Once the
        response has ended, the rest of the body is read and dropped."""
        port = self.port
        pacer, user = port.pacer, port.user_id
        pieces = taking_turns(body_pieces(self.environ),
                              lambda spent: pacer.took(user, spent))
        lines = iter_lines(pieces, port.limits.max_message_size, port.limits.body_timeout)
        try:
            if not self._hand_lines(lines):
                return
            for _ in pieces:
                pass
        except RequestTimeout as exc:  # stalled inside a line: end the response
            log.info("stream %s: %s; ending the response, the session stays for resume",
                     port.id, exc.message)
            self._stalled = True
            self.gone()
            return
        except Exception as exc:  # the client went away, or broke the chunked encoding
            log.debug("stream %s: request body ended: %r", port.id, exc)
            self.gone()
            return
        self.watch_peer()

    def _hand_lines(self, lines: Iterator[bytes]) -> bool:
        """Each line to the session until the body or the response ends; a line over
        ``max_message_size`` as its ERROR. False once the response is to end now."""
        while self._closing is None and not self._finished:
            try:
                line: bytes | MessageTooLarge | None = next(lines, None)
            except MessageTooLarge as exc:  # its ERROR line, then the response ends
                line = exc
            if line is None:
                break
            if not self._hand_over(line):
                return False
        return True

    def _hand_carried(self, body: bytes) -> None:
        """Upstream, for a body already in memory: ``_read_body``'s loop over its one
        piece (it cannot stall or break its framing), and the user's pacing: their pause,
        if they owe one, before; after, a costly turn told to the pacer (they owe it, and
        pay it before the first write). A cheap one gives no turn here, where the reader
        gave one: the response writes and waits for its next wake right after, a turn
        for every other greenlet, where the reader went on reading."""
        port = self.port
        pacer, user = port.pacer, port.user_id
        pacer.pause(user)
        started = monotonic()
        lines = iter_lines((body,), port.limits.max_message_size)
        bell = port.bell if self.quiet_hand_over and self._attached else None
        if bell is not None:
            bell.puller = gevent.getcurrent()
            self._pull_after = True
        try:
            if not self._hand_lines(lines):
                return
        finally:
            if bell is not None:
                bell.puller = self.reader  # None: every ring answered again
        spent = monotonic() - started
        if spent >= COSTLY:
            pacer.took(user, spent)
        self.watch_peer()

    def _hand_over(self, line: bytes | MessageTooLarge) -> bool:
        """One line (or the refusal of one too long to read) to the session; False when
        handling it failed (the response then ends)."""
        try:
            if isinstance(line, MessageTooLarge):
                self.port.too_large(line, close=True)
            else:
                self.port.receive(line)
        except Exception:
            log.exception("stream %s: handling a line failed", self.port.id)
            self.gone()
            return False
        return True

    def after_response(self) -> None:
        """A response that ended before its request body did (too large, unsupported
        version, closed by the server): let the reader drain that body for a moment so the
        close does not reset the connection under the response's tail, then cut it."""
        reader = self._reader
        if self._stalled:  # the server would wait for the rest of that body before the
            shutdown(self.sock)  # next request
        if reader is None or reader.dead:
            return
        reader.join(LINGER_SECONDS)
        if not reader.dead:
            shutdown(self.sock)
            reader.kill(block=True, timeout=1)


def opens_stream(request: Request) -> bool:
    """Whether a POST /proto/stream opens a streaming response (new or resumed), rather
    than being a follow-up POST answered 202."""
    return not request.args.get("session") or bool(request.args.get("last_seq"))


def handle_post(ports: "Ports", request: Request) -> Response:
    """POST /proto/stream: a new stream, a follow-up (202) or a resume (last_seq)."""
    if not opens_stream(request):
        return post_messages(ports, request)
    try:
        return stream_response(ports, request.args, request.headers.get("Authorization"),
                               request.environ)
    except ProtoError as exc:
        return error_response(exc)


def open_downstream(ports: "Ports", args: Mapping[str, str], authorization: str | None,
                    environ: dict[str, Any]) -> NDJSONStream:
    """A POST /proto/stream that opens a stream (new, or resumed with ``last_seq``): its
    stream, or the contract's ProtoError. Flask's route (``stream_response``) and
    protoflask's own app's lane (post_lane.py, ``NDJSONStream.wsgi_app``) both open
    streams with this."""
    session_id = args.get("session") or None
    last_seq = parse_seq_arg(args.get("last_seq"), "last_seq")
    admission = ports.admit(token_from_request(args.get("token"), authorization), session_id,
                            last_seq, NDJSONStream.kind, ticket=args.get("ticket"))
    return NDJSONStream(ports.port(admission, NDJSONStream.kind), environ)


def stream_response(ports: "Ports", args: Mapping[str, str], authorization: str | None,
                    environ: dict[str, Any]) -> Response:
    """``open_downstream``'s stream as a Flask response."""
    return open_downstream(ports, args, authorization, environ).response()
