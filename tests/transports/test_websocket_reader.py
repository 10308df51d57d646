"""The WebSocket reader's own frame split (the fast path for small final masked data
frames) against the `websockets` protocol reading every byte itself: for any stream of
frames, valid or not, cut into reads anywhere, both hand on the same messages and write
the same bytes (pongs, close frames), and end in the same state. The split reader starts
with the protocol object's stand-in (``lazy_protocol``, ws_protocol.py) or the object
itself: the same again."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings, strategies as st
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from protoflask.turns import Pacer
from protoflask.transports.websocket import WebSocketConnection
from protoflask.transports.ws_protocol import OpenUnparsed, open_unparsed

MAX_SIZE = 100_000


class Reads:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def recv(self, _n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def send(self, data: Any) -> int:
        return len(data)

    def shutdown(self, _how: int) -> None:
        pass


class Recording(WebSocketConnection):
    def __init__(self, chunks: list[bytes], split: bool,
                 lazy: bool = False) -> None:  # no engine: recorded
        self.sock = Reads(chunks)  # type: ignore[assignment]
        self.protocol = open_unparsed(MAX_SIZE) if lazy \
            else ServerProtocol(state=State.OPEN, max_size=MAX_SIZE)
        self.split_frames = split
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._closing = False
        self._owed = 0
        self.seen: list[Any] = []
        # the reader hands a common ASCII text message to its port's receive itself
        self.port = self  # type: ignore[assignment]
        self.pacer = Pacer()  # the port's (turns.Pacer), and the user it paces
        self.user_id = "recorded"

    def receive(self, data: bytes) -> None:
        self.seen.append(("message", Opcode.TEXT, data))

    def _on_message(self, opcode: Opcode, data: bytes) -> None:
        self.seen.append(("message", opcode, data))
        if opcode is Opcode.TEXT:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.parser().fail(1007, f"invalid UTF-8 at position {exc.start}")

    def _report_too_large(self) -> None:
        assert isinstance(self.protocol.parser_exc, PayloadTooBig)
        self.protocol.parser_exc = None
        self.seen.append("too large")

    def flush(self) -> None:
        out = b"".join(self.parser().data_to_send()) if self.protocol.writes else b""
        if out:
            self.seen.append(("wrote", out))


def frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


def unmasked(data: bytes) -> bytes:
    return Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])


texts = st.one_of(st.text(max_size=100).map(str.encode),
                  st.integers(min_value=60_000, max_value=70_000).map(lambda n: b"x" * n))
payloads = st.one_of(st.binary(max_size=300), texts)  # binary: invalid UTF-8 too
frames = st.one_of(
    payloads.map(lambda d: frame(Opcode.TEXT, d)),
    payloads.map(lambda d: frame(Opcode.BINARY, d)),
    st.text(max_size=40).map(str.encode).map(
        lambda d: frame(Opcode.TEXT, d, fin=False) + frame(Opcode.CONT, b"ab", fin=False)
        + frame(Opcode.PING, b"p") + frame(Opcode.CONT, d)),
    st.binary(max_size=20).map(lambda d: frame(Opcode.PING, d)),
    st.binary(max_size=20).map(lambda d: frame(Opcode.PONG, d)),
    st.just(frame(Opcode.CONT, b"stray")),
    st.just(b"\xc1" + frame(Opcode.TEXT, b"rsv")[1:]),  # RSV1 without an extension
    st.just(b"\x83\x80abcd"),  # reserved opcode
    st.binary(max_size=30).map(unmasked),
    st.just(frame(Opcode.TEXT, b"y" * (MAX_SIZE + 1))),
    st.just(b"\x81\xff" + (2 ** 40).to_bytes(8, "big") + b"mask"),  # a huge header
    st.just(Frame(Opcode.CLOSE, (1000).to_bytes(2, "big") + b"bye").serialize(
        mask=True, extensions=[])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=8), st.lists(st.integers(min_value=1, max_value=70_000),
                                               max_size=12), st.booleans())
def test_split_reader_matches_the_protocol(stream: list[bytes], cuts: list[int],
                                           eof_midway: bool) -> None:
    data = b"".join(stream)
    if eof_midway and data:
        data = data[:len(data) // 2]
    chunks, i = [], 0
    for cut in cuts:
        if i >= len(data):
            break
        chunks.append(data[i:i + cut])
        i += cut
    if i < len(data):
        chunks.append(data[i:])
    fast, slow = Recording(chunks, split=True), Recording(chunks, split=False)
    lazy = Recording(chunks, split=True, lazy=True)
    fast._read_loop()
    slow._read_loop()
    lazy._read_loop()
    assert lazy.seen == fast.seen  # the stand-in changes nothing the reader does
    assert isinstance(lazy.protocol, ServerProtocol)  # the end of the stream needed it
    assert lazy.protocol.close_sent == fast.protocol.close_sent
    assert lazy.protocol.state is fast.protocol.state
    if fast.protocol.close_sent is None or fast.protocol.close_rcvd is not None:
        assert fast.seen == slow.seen  # no failure: exactly the same
        assert fast.protocol.close_sent == slow.protocol.close_sent
        assert type(fast.protocol.parser_exc) is type(slow.protocol.parser_exc)
    else:
        # The server failed the connection (1002, 1007, 1009): the split reader hands on
        # nothing read after the failing frame, where the protocol alone still handles
        # what it parsed from the same read before its caller saw the failure.
        handled = [e for e in fast.seen if e[0] != "wrote"]
        assert handled == [e for e in slow.seen if e[0] != "wrote"][:len(handled)]
        # both fail it; with two faults in one read the split reader names the first
        assert slow.protocol.close_sent is not None
    assert fast.protocol.state is slow.protocol.state


def test_many_frames_in_one_read_and_one_frame_over_many() -> None:
    stream = b"".join(frame(Opcode.TEXT, b'{"n":%d}' % n) for n in range(50))
    one = Recording([stream], split=True)
    one._read_loop()
    bytewise = Recording([stream[i:i + 1] for i in range(len(stream))], split=True)
    bytewise._read_loop()
    expected = [("message", Opcode.TEXT, b'{"n":%d}' % n) for n in range(50)]
    assert one.seen[:50] == expected
    assert bytewise.seen[:50] == expected


def test_nothing_after_invalid_utf8() -> None:
    stream = (frame(Opcode.TEXT, b"ok") + frame(Opcode.TEXT, b"\x80")
              + frame(Opcode.PING, b"p") + frame(Opcode.TEXT, b"late"))
    reader = Recording([stream], split=True)
    reader._read_loop()
    assert reader.seen[0] == ("message", Opcode.TEXT, b"ok")
    assert reader.seen[1] == ("message", Opcode.TEXT, b"\x80")
    assert reader.seen[2][0] == "wrote" and reader.seen[2][1].startswith(b"\x88")  # 1007
    assert len(reader.seen) == 3


def test_small_text_frames_leave_the_stand_in_in_place() -> None:
    """What an idle session's reader sees (its client's PONGs and messages) never needs
    the protocol object; a PING frame does."""
    stream = b"".join(frame(Opcode.TEXT, b'{"n":%d}' % n) for n in range(5))
    reader = Recording([stream, stream], split=True, lazy=True)
    reader._read_frames(stream)
    assert type(reader.protocol) is OpenUnparsed
    assert len(reader.seen) == 5
    reader._read_frames(frame(Opcode.PING, b"p"))
    assert isinstance(reader.protocol, ServerProtocol)
    reader.flush()
    assert reader.seen[-1] == ("wrote", b"\x8a\x01p")  # the PING answered
