"""A WebSocket connection's ``websockets`` protocol object, made when a frame needs it.

Without an extension the reader splits the common data frames itself
(``WebSocketConnection.split_frames``) and writes text frames itself (``text_frames``):
the protocol object only ever sees control frames, fragments, oversized or malformed
frames, the end of the stream and the close handshake. Until one of those comes, an idle
connection's ``ServerProtocol`` (its state, its frame parser's three suspended
generators, its reader buffer, its uuid: ~1.1 KB, issue 29) holds nothing it needs. So
it starts with ``OPEN_UNPARSED``, a shared stand-in answering what the reader and the
writer read on every pass (open, nothing written, no extension, no failure, the size
limit), and ``WebSocketConnection.parser`` puts the real object in its place on the
first call that needs one; from then on it is the real one for good. The stand-in is
never written to: every write (``receive_data``, ``send_close``, ``fail``, extensions)
goes through ``parser`` first.

The swap point is ``WebSocketConnection.lazy_protocol`` (tests/transports/
test_websocket_reader.py runs its frame streams over both, and over the eager one).
"""

from __future__ import annotations

from typing import Any

from websockets.protocol import State
from websockets.server import ServerProtocol


class OpenUnparsed:
    """An open connection whose protocol has parsed nothing and has nothing to write.

    Every attribute is a slot, set once: the reader and the writer read them on every
    message, and the interpreter reads a slot as fast as a ServerProtocol's own attribute
    (a class attribute read from an instance is not specialised in Python 3.11: ~2k more
    instructions a PING, bench/instructions.py)."""

    __slots__ = ("_state", "state", "extensions", "writes", "parser_exc", "current_size",
                 "close_rcvd", "close_sent", "max_message_size")

    def __init__(self, max_message_size: int | None) -> None:
        # what ServerProtocol.state's getter reads (websocket._state_of), and the property
        self._state = self.state = State.OPEN
        self.extensions: tuple[Any, ...] = ()  # none: the reader splits frames itself
        self.writes: tuple[bytes, ...] = ()  # nothing queued (tested before asking)
        self.parser_exc = None
        self.current_size = None  # no fragmented message being read
        self.close_rcvd = self.close_sent = None
        self.max_message_size = max_message_size


_SHARED: dict[int | None, OpenUnparsed] = {}


def open_unparsed(max_size: int | None) -> OpenUnparsed:
    """The stand-in for connections whose messages are limited to ``max_size``: one per
    limit (a worker has one), shared by every connection that has not needed more."""
    shared = _SHARED.get(max_size)
    if shared is None:
        shared = _SHARED[max_size] = OpenUnparsed(max_size)
    return shared


def open_protocol(max_size: int | None) -> ServerProtocol:
    """The real protocol of an upgraded connection: the handshake is done, so it starts
    OPEN."""
    return ServerProtocol(state=State.OPEN, max_size=max_size)
