"""WebSocket transport: frames bytes between a socket and the session layer.

The Flask route (``websocket=True``, as flask-sock registers it) authenticates and
refuses with an HTTP error before any upgrade; then the raw socket is taken from the
WSGI environ and driven here, from one greenlet, by the ``websockets`` library's
sans-I/O ``ServerProtocol`` (docs/PERFORMANCE.md explains why not simple-websocket's
reader thread). This adapter adds what a sans-I/O protocol leaves to its caller:
reassembly of fragmented messages, strict UTF-8 on text (close 1007), a message size
limit reported in-protocol before close 1009, one writer at a time, and a bounded
close handshake.
"""

from __future__ import annotations

import logging
import socket
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable

import gevent
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

from ..core.errors import MessageTooLarge
from ..turns import SLICE
from .sockets import immediate_send, read_wait, shutdown
from .ws_handshake import accept_fast, accept_plain
from .ws_protocol import OpenUnparsed, open_protocol, open_unparsed

if TYPE_CHECKING:
    from ..port import Admission, Limits, Ports, SessionPort

log = logging.getLogger("protoflask.websocket")

CLOSE_TIMEOUT = 2.0  # seconds to wait for the client's close frame
# Enum members as module constants: ten times cheaper to read, several reads a message.
_OPEN, _CLOSED = State.OPEN, State.CLOSED
_TEXT, _BINARY = Opcode.TEXT, Opcode.BINARY
# The protocol's state, read through its property's getter: a Python call from Python code,
# not the descriptor machinery's call from C (three reads a message: 0.25k instructions less)
# (the stand-in of ws_protocol.py answers it too)
_state_of: Callable[["ServerProtocol | OpenUnparsed"], State] = \
    ServerProtocol.state.fget  # type: ignore[attr-defined]
RECV_SIZE = 65536
#: deflated bytes handed to the protocol at a time (inflated: up to a few messages)
FEED_SIZE = 8192


_SMALL_TEXT_HEADS = [bytes((0x81, n)) for n in range(126)]
#: text frames shorter than this (most envelopes) get a head made once, looked up on flush
HEADS_BELOW = 1024
_TEXT_HEADS = _SMALL_TEXT_HEADS + [b"\x81\x7e" + n.to_bytes(2, "big")
                                   for n in range(126, HEADS_BELOW)]


def text_frame(data: bytes) -> bytes:
    """A server's text frame: final, unmasked, no extension (RFC 6455 section 5.2).

    What websockets' Frame.serialize produces for that case, without its generality:
    on the hot path of an uncompressed connection every message is one of these."""
    n = len(data)
    if n < 126:
        return _SMALL_TEXT_HEADS[n] + data
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + data
    return b"\x81\x7f" + n.to_bytes(8, "big") + data


def frames_plain(ready: list[tuple[int, bytes]]) -> list[bytes]:
    """Each message of ``ready`` as a server's text frame, by websockets' own
    ``Frame.serialize`` (no extension): the definition ``frames_fast`` is held to."""
    return [Frame(Opcode.TEXT, data).serialize(mask=False) for _, data in ready]


def frames_fast(ready: list[tuple[int, bytes]]) -> list[bytes]:
    """``frames_plain``, with a head made once for each length below HEADS_BELOW (most
    envelopes) and ``text_frame`` above."""
    frames = []  # a loop, not a comprehension: no frame of its own (Python 3.11)
    for _, data in ready:
        n = len(data)
        frames.append(_TEXT_HEADS[n] + data if n < HEADS_BELOW else text_frame(data))
    return frames


#: the swap point: how a flush frames a batch when no extension was negotiated
#: (tests/transports/test_websocket_frames.py runs the same cases over both)
text_frames = frames_fast


class WebSocketConnection:
    """One client's WebSocket, attached to one session at a time."""

    kind = "websocket"
    #: split the common data frames here rather than in the protocol (no extension only)
    split_frames = True
    #: start with ws_protocol's shared stand-in, the protocol object made on first need
    lazy_protocol = True

    def __init__(self, limits: "Limits", sock: socket.socket, compression: bool) -> None:
        self.limits = limits
        self.sock = sock
        #: a send() that takes what the kernel takes at once, or BlockingIOError (None for
        #: a TLS socket: every write there goes the waiting way)
        self._send_now = immediate_send(sock)
        self.compression = compression
        #: the websockets protocol, or its stand-in until a frame needs it (``parser``)
        self.protocol: ServerProtocol | OpenUnparsed = \
            open_unparsed(limits.max_message_size) if self.lazy_protocol \
            else open_protocol(limits.max_message_size)
        self.port: "SessionPort | None" = None
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._writing = self._flush_scheduled = self._closing = False
        #: the greenlet that reads, and pulls what is ready after each read (Writer.reader)
        self.reader: gevent.Greenlet | None = None
        self._owed = 0  # bytes of a frame the protocol is reading still to come
        self.opened = False  # attached to its session: ``serve`` leaves its end to the port

    # -- opening ---------------------------------------------------------------------

    def accept(self, environ: dict[str, Any]) -> bool:
        """Answer the upgrade; False if websockets refused the request (already answered).

        The HTTP request was parsed by the WSGI server, so a throwaway protocol object
        negotiates the handshake and the frame protocol starts OPEN with its extensions.
        The common upgrade is answered from a template (``accept_fast``)."""
        answer = accept_fast(environ, self.compression) \
            or accept_plain(environ, self.compression)
        chunks, extensions, accepted = answer
        if extensions:  # a deflating connection's frames all go through the protocol
            self.parser().extensions = extensions
        self._send(chunks)
        return accepted

    def parser(self) -> ServerProtocol:
        """The websockets protocol object, made now if its stand-in was in its place
        (ws_protocol.py): every call that gives it bytes or has it write comes here."""
        protocol = self.protocol
        if type(protocol) is OpenUnparsed:
            protocol = self.protocol = open_protocol(protocol.max_message_size)
        assert isinstance(protocol, ServerProtocol)
        return protocol

    def serve(self, port: "SessionPort") -> None:
        """Attach to the session and pump until the connection ends, in the greenlet
        ``web._serve_apart`` spawns for it, apart from the upgrade request (the request's
        frames are not held for the connection's life: docs/PERFORMANCE.md)."""
        self.reader = gevent.getcurrent()
        self.port = port
        port.attach(self)
        self.opened = True
        try:
            self.flush()
            self._read_loop()
        except OSError:
            pass  # the peer went away; the session stays for resume
        finally:
            port.end()
            self._shutdown()

    def _read_loop(self) -> None:
        protocol = self.protocol
        sock = self.sock
        # Without an extension the reader splits frames itself (below); a deflating
        # connection leaves every byte to the protocol.
        own_frames = self.split_frames and not protocol.extensions
        pending = b""  # an incomplete small data frame, kept until the rest comes
        if protocol.state is _CLOSED:
            return
        wait, readable = read_wait(sock) or (None, None)
        assert self.port is not None
        pacer, user = self.port.pacer, self.port.user_id
        owed = pacer.owed
        while True:  # until the connection is closed (checked after each read)
            if wait is not None:
                wait(readable)
            if owed:  # some user's costly turns: this one's may have to wait
                pacer.pause(user)
            data = sock.recv(RECV_SIZE)
            if not data:
                protocol = self.parser()
                if pending:  # an incomplete frame: the protocol reports the EOF in it
                    protocol.receive_data(pending)
                protocol.receive_eof()
                self._protocol_events()
            elif own_frames:
                pending = self._read_frames(pending + data if pending else data)
                protocol = self.protocol  # the real one, if a frame needed it
            else:  # deflated: fed a piece at a time, so that one read of 64 KiB (a
                # thousand times that inflated) is never all held, nor handled, at once
                protocol = self.parser()
                turn = monotonic()
                for i in range(0, len(data), FEED_SIZE):
                    protocol.receive_data(data[i:i + FEED_SIZE])
                    turn = self._protocol_events(turn)
            # almost always None: that cheap test first, the isinstance call only then
            if protocol.parser_exc is not None and isinstance(protocol.parser_exc, PayloadTooBig):
                self._report_too_large()
            self.flush()
            if not data or _state_of(protocol) is _CLOSED:
                return

    def _read_frames(self, data: bytes) -> bytes:
        """Handle the frames of ``data``; return the start of an incomplete one.

        The common frame (a final, unfragmented, masked text or binary frame of at most
        RECV_SIZE bytes, on an open connection) is unmasked and handed on here, which
        costs a fraction of the protocol's generator-based parser. Every other frame
        (control frames, fragments, oversized or malformed ones, anything once closing)
        goes to the protocol whole, so the protocol always stands at a frame boundary
        and answers those exactly as it answers when it reads every byte itself; a frame
        too large to keep here is passed on as it comes (``_owed``: the bytes of it
        still to pass)."""
        protocol: ServerProtocol | OpenUnparsed = self.protocol
        i, n = 0, len(data)
        if self._owed:
            i = min(self._owed, n)
            self._owed -= i
            protocol = self.parser()
            protocol.receive_data(data[:i])
            self._protocol_events()
        max_size = protocol.max_message_size
        assert self.port is not None
        receive = self.port.receive
        while i < n:
            # read again for each frame: a message handed on may have closed the
            # connection, which puts the real protocol in the stand-in's place
            protocol = self.protocol
            if _state_of(protocol) is not _OPEN:
                self.parser().receive_data(data[i:])
                self._protocol_events()
                return b""
            if n - i < 2:
                break
            head1, head2 = data[i], data[i + 1]
            length, start = head2 & 0x7F, i + 2
            if length == 126:
                if n - start < 2:
                    break
                length, start = data[start] << 8 | data[start + 1], start + 2
            elif length == 127:
                if n - start < 8:
                    break
                length, start = int.from_bytes(data[start:start + 8], "big"), start + 8
            masked = head2 & 0x80
            if masked:
                start += 4
            end = start + length
            if (head1 == 0x81 or head1 == 0x82) and masked and length <= RECV_SIZE \
                    and protocol.current_size is None \
                    and (max_size is None or length <= max_size):
                if end > n:
                    break  # the rest of it comes with the next read
                message = apply_mask(data[start:end], data[start - 4:start])
                if head1 == 0x81 and message.isascii() and not self._closing:
                    receive(message)  # _on_message's common case, inline
                else:
                    self._on_message(_TEXT if head1 == 0x81 else _BINARY, message)
            else:
                if max_size is not None and length > max_size:
                    end = n  # the protocol refuses it from its header (1009)
                elif end > n:
                    self._owed = end - n
                    end = n
                protocol = self.parser()
                protocol.receive_data(data[i:end])
                self._protocol_events()
            i = end
        return data[i:] if i else data

    def _protocol_events(self, turn: float = 0.0) -> float:
        """Handle the frames the protocol parsed. A message that is not the reader's
        common small frame (deflated, large, fragmented) may be costly to handle: once
        the frames of this turn (begun at ``turn``, else now) took a SLICE, the others
        get a turn, or, if it was costly, the user pauses (turns.Pacer). Returns when
        the turn now going on began."""
        events = self.parser().events_received()
        if not events:
            return turn
        if not turn:
            turn = monotonic()
        for frame in events:
            assert isinstance(frame, Frame)  # the handshake is done: only frames now
            self._on_frame(frame)
            spent = monotonic() - turn
            if spent > SLICE:
                assert self.port is not None
                self.port.pacer.took(self.port.user_id, spent)
                turn = monotonic()
        return turn

    # -- receiving -------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if frame.fin:
                self._on_message(opcode, bytes(frame.data))
            else:
                self._fragment_opcode = opcode
                self._fragments = [bytes(frame.data)]
        elif opcode is Opcode.CONT and self._fragment_opcode is not None:
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                data = b"".join(self._fragments)
                opcode, self._fragment_opcode, self._fragments = self._fragment_opcode, None, []
                self._on_message(opcode, data)

    def _on_message(self, opcode: Opcode, data: bytes) -> None:
        assert self.port is not None
        if self._closing:
            return
        if opcode is _BINARY:
            self.port.receive_binary(data)
            return
        if not data.isascii():  # ASCII is UTF-8, and costs no decoding to tell
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.parser().fail(1007, f"invalid UTF-8 at position {exc.start}")
                return
        self.port.receive(data)

    def _report_too_large(self) -> None:
        """websockets already queued close 1009: put the ERROR frame in front of it."""
        port = self.port
        assert port is not None
        protocol = self.parser()
        protocol.parser_exc = None
        closing = protocol.data_to_send()
        self._closing = True  # from here the reader writes; a scheduled flush must not
        port.too_large(MessageTooLarge(
            f"message exceeds maxMessageSize ({self.limits.max_message_size} bytes)"))
        frames = [Frame(Opcode.TEXT, data).serialize(mask=False, extensions=protocol.extensions)
                  for _, data in port.take_final()]
        self._send(frames + closing)

    # -- sending (Transport) ---------------------------------------------------------

    def wake(self) -> None:
        """The port's bell rang (the event loop runs this; a ring from the reader is
        dropped, as it flushes after each read anyway): a flush is scheduled, once."""
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        # a raw greenlet: a heartbeat tick wakes every session at once, and gevent's
        # Greenlet (its spawning stack, its links) was ~0.9 KB each, whose peak the
        # worker's heap keeps (docs/PERFORMANCE.md, p7-storm)
        gevent.spawn_raw(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        try:
            self.flush()
        except OSError:
            self._shutdown()

    def flush(self) -> None:
        """Write everything pending. One writer at a time: a flush that finds another in
        progress returns at once, and the active one loops until nothing is left.

        The common write (the kernel takes it all at once) is one send() with no greenlet
        switch and is never in flight; only a write the kernel does not take whole is
        reported in flight (back-pressure and the slow-consumer check read it) while the
        rest waits for room. What to write comes from the port (``SessionPort.take``): on
        a cluster it goes to the journal first and comes back with a wake, and until then
        nothing else is written (a close frame must not overtake it)."""
        port = self.port
        if self._writing or port is None:
            return
        self._writing = True
        try:
            while True:
                # read again each pass: a close from the reader while this one waited for
                # room may have put the real protocol in the stand-in's place
                protocol = self.protocol
                open_ = _state_of(protocol) is _OPEN
                ready = port.take(open_ and not self._closing)
                if ready and not open_:  # a batch the journal held, closed meanwhile (a
                    ready = []  # drain, a move): the window has it for a resume
                if ready:
                    frames = self._frames(ready) if protocol.extensions else text_frames(ready)
                    if protocol.writes:
                        frames += self.parser().data_to_send()
                elif protocol.writes and not port.holding:  # (held: in the journal, and
                    frames = self.parser().data_to_send()  # its release rings for the next flush)
                else:
                    return
                if not frames:
                    return
                data = b"".join(frames)
                whole = False  # written at once, without a switch to another greenlet
                if data:
                    try:
                        sent = self._send_now(data) if self._send_now is not None else 0
                    except BlockingIOError:
                        sent = 0
                    if sent < len(data):
                        self._send_blocking(port, data, sent)
                    else:
                        port.written()
                        whole = True
                if frames[-1] == b"":  # websockets' signal to half-close
                    self._shutdown(socket.SHUT_WR)
                elif whole and not protocol.writes and not port.has_writable():
                    # the common end: nothing came meanwhile (a resume ``written`` queued
                    # would be writable), so no second pass to find that out (a ``take``
                    # and the protocol's state read: docs/PERFORMANCE.md, "The tool row
                    # within 5%")
                    return
        finally:
            self._writing = False

    def _frames(self, ready: list[tuple[int, bytes]]) -> list[bytes]:
        """The frames of messages taken for the wire."""
        protocol = self.parser() if self.protocol.extensions else None
        if protocol is not None:  # permessage-deflate: through the protocol
            for _, data in ready:
                protocol.send_text(data)
            return protocol.data_to_send()
        return text_frames(ready)

    def _send_blocking(self, port: "SessionPort", data: bytes, sent: int) -> None:
        """The rest of a write the kernel did not take whole: in flight until written."""
        view = memoryview(data)[sent:]
        port.in_flight(len(view))
        try:
            while view:
                view = view[self.sock.send(view):]
        finally:
            port.in_flight(0)

    def close(self, code: int, reason: str) -> None:
        """Flush, send the close frame, and give the client CLOSE_TIMEOUT to answer."""
        if self._closing or self.protocol.state is not State.OPEN:
            return
        try:
            self.flush()
            self._closing = True
            self.parser().send_close(code, reason)
            self.flush()
        except OSError:
            self._shutdown()
            return
        gevent.spawn_later(CLOSE_TIMEOUT, self._shutdown)

    def _send(self, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        if data:
            # send() in a loop rather than sendall(): gevent's sendall asks the kernel for
            # SO_SNDBUF on every call, a syscall per message on the hot path.
            view = memoryview(data)
            while view:
                view = view[self.sock.send(view):]
        if chunks and chunks[-1] == b"":  # websockets' signal to half-close
            self._shutdown(socket.SHUT_WR)

    def _shutdown(self, how: int = socket.SHUT_RDWR) -> None:
        shutdown(self.sock, how)


def serve(ports: "Ports", admission: "Admission", sock: socket.socket,
          environ: dict[str, Any], compression: bool) -> None:
    """An admitted WebSocket request: answer the upgrade, then serve the session on the
    socket until the connection ends (in a greenlet of its own, apart from the upgrade
    request: ``web._serve_apart``). The connection slot ``admit`` counted is given back
    however it ends."""
    conn = WebSocketConnection(ports.limits, sock, compression)
    try:
        accepted = conn.accept(environ)
        del environ  # the upgrade's headers are not held for the connection's life
        if accepted:
            conn.serve(ports.port(admission, WebSocketConnection.kind))
    except OSError:
        pass
    finally:
        if not conn.opened:  # else the port gave it back (SessionPort.end)
            ports.abandon(admission, WebSocketConnection.kind)
