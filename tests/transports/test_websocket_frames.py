"""The WebSocket flush's framing (transports/websocket.py's ``text_frames`` swap point):
``frames_fast`` (a head made once per small length) against ``frames_plain``
(websockets' own ``Frame.serialize``), over the same batches; and a flush writes the same
bytes whichever is bound."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

import protoflask.transports.websocket as websocket
from protoflask.transports.websocket import WebSocketConnection, frames_fast, frames_plain

LENGTHS = [0, 1, 2, 125, 126, 127, 1000, 1023, 1024, 1025, 65535, 65536, 70_000]
BATCHES = [
    [(1, b"x" * n)] for n in LENGTHS
] + [
    [(1, '{"text": "h\u00e9llo \u4e16\u754c"}'.encode())],  # UTF-8 beyond ASCII
    [(seq, b"m" * n) for seq, n in enumerate(LENGTHS, 1)],  # one batch of every size
    [],
]


def decoded(frames: list[bytes]) -> list[bytes]:
    """What a client reads from the frames (websockets' own parser)."""
    client = ClientProtocol(parse_uri("ws://localhost/"), state=State.OPEN, max_size=None)
    client.receive_data(b"".join(frames))
    events = client.events_received()
    assert all(isinstance(e, Frame) for e in events)
    return [bytes(e.data) for e in events]


@pytest.mark.parametrize("frames_of", [frames_plain, frames_fast], ids=["plain", "fast"])
class TestTextFrames:
    @pytest.mark.parametrize("batch", BATCHES)
    def test_the_same_bytes_as_the_plain_path(self, frames_of: Any,
                                              batch: list[tuple[int, bytes]]) -> None:
        assert frames_of(batch) == frames_plain(batch)

    @pytest.mark.parametrize("batch", BATCHES)
    def test_a_client_reads_each_message_back(self, frames_of: Any,
                                              batch: list[tuple[int, bytes]]) -> None:
        assert decoded(frames_of(batch)) == [data for _, data in batch]

    def test_the_fast_path_is_the_one_in_use(self, frames_of: Any) -> None:
        assert websocket.text_frames is frames_fast


class Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: Any) -> int:
        self.sent.append(bytes(data))
        return len(data)


class OneBatch:
    """A port with one batch to write."""

    holding = False

    def __init__(self, batch: list[tuple[int, bytes]]) -> None:
        self.batch = batch

    def take(self, fresh: bool = True) -> list[tuple[int, bytes]]:
        batch, self.batch = self.batch, []
        return batch

    def written(self) -> None:
        pass

    def has_writable(self) -> bool:
        return bool(self.batch)


class ThenAnother(OneBatch):
    """A port whose ``written`` makes another message writable (the back-pressure resume
    a write decides queues its RESUME_CHANNEL so)."""

    def written(self) -> None:
        if not self.batch and not getattr(self, "resumed", False):
            self.resumed = True
            self.batch = [(9, b"resume")]


def flushed(batch: list[tuple[int, bytes]], port: type[OneBatch] = OneBatch) -> list[bytes]:
    conn = WebSocketConnection.__new__(WebSocketConnection)
    wire = Wire()
    conn.sock = wire  # type: ignore[assignment]
    conn._send_now = wire.send
    conn.protocol = ServerProtocol(state=State.OPEN)
    conn._writing = conn._closing = False
    conn.port = port(batch)  # type: ignore[assignment]
    conn.flush()
    return wire.sent


def test_a_flush_writes_what_its_write_made_writable_before_it_ends() -> None:
    """The flush ends after a whole write only when nothing is left (its one ``take``
    in the common case): what ``written`` queued goes in the same flush."""
    assert flushed([(1, b"a")], ThenAnother) == [b"".join(frames_plain([(1, b"a")])),
                                                  b"".join(frames_plain([(9, b"resume")]))]


@pytest.mark.parametrize("frames_of", [frames_plain, frames_fast], ids=["plain", "fast"])
def test_a_flush_writes_the_same_bytes_with_either(frames_of: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    batch = BATCHES[-2]
    plain = flushed(batch)
    monkeypatch.setattr(websocket, "text_frames", frames_of)
    assert flushed(batch) == plain == [b"".join(frames_plain(batch))]
