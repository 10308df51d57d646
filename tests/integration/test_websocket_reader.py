"""The WebSocket reader's own frame split (the fast path for small final masked data
frames) against the `websockets` protocol reading every byte itself: for any stream of
frames, valid or not, cut into reads anywhere, both hand on the same messages and write
the same bytes (pongs, close frames), and end in the same state."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings, strategies as st
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from protoflask.transports.websocket import WebSocketConnection

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
    def __init__(self, chunks: list[bytes], split: bool) -> None:  # no engine: recorded
        self.sock = Reads(chunks)  # type: ignore[assignment]
        self.protocol = ServerProtocol(state=State.OPEN, max_size=MAX_SIZE)
        self.split_frames = split
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._closing = False
        self._owed = 0
        self.seen: list[Any] = []

    def _on_message(self, opcode: Opcode, data: bytes) -> None:
        self.seen.append(("message", opcode, data))
        if opcode is Opcode.TEXT:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.protocol.fail(1007, f"invalid UTF-8 at position {exc.start}")

    def _report_too_large(self) -> None:
        assert isinstance(self.protocol.parser_exc, PayloadTooBig)
        self.protocol.parser_exc = None
        self.seen.append("too large")

    def flush(self) -> None:
        out = b"".join(self.protocol.data_to_send())
        if out:
            self.seen.append(("wrote", out))


def frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


def unmasked(data: bytes) -> bytes:
    return Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])


payloads = st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode),
                     st.integers(min_value=60_000, max_value=70_000).map(lambda n: b"x" * n))
frames = st.one_of(
    payloads.map(lambda d: frame(Opcode.TEXT, d)),
    payloads.map(lambda d: frame(Opcode.BINARY, d)),
    st.binary(max_size=40).map(lambda d: frame(Opcode.TEXT, d, fin=False)
                               + frame(Opcode.CONT, d[:5], fin=False)
                               + frame(Opcode.PING, b"p") + frame(Opcode.CONT, d[5:])),
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
    fast._read_loop()
    slow._read_loop()
    assert fast.seen == slow.seen
    assert fast.protocol.state is slow.protocol.state
    assert type(fast.protocol.parser_exc) is type(slow.protocol.parser_exc)


def test_many_frames_in_one_read_and_one_frame_over_many() -> None:
    stream = b"".join(frame(Opcode.TEXT, b'{"n":%d}' % n) for n in range(50))
    one = Recording([stream], split=True)
    one._read_loop()
    bytewise = Recording([stream[i:i + 1] for i in range(len(stream))], split=True)
    bytewise._read_loop()
    expected = [("message", Opcode.TEXT, b'{"n":%d}' % n) for n in range(50)]
    assert one.seen[:50] == expected
    assert bytewise.seen[:50] == expected
