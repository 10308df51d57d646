"""The HTTP transports frame a wake's messages in one go (``frames``): byte for byte what
framing them one by one (``frame``) gives, for SSE and the NDJSON stream."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from protoflask.transports.http import HTTPDownstream
from protoflask.transports.sse import SSEStream
from protoflask.transports.stream import NDJSONStream

READY = [
    [(1, b'{"a":1}')],
    [(7, b'{"type":"PONG"}'), (8, b'{"x":"\\n"}'), (2**53 - 1, b"{}")],
    [(n, b'{"n":%d}' % n) for n in range(1, 60)],
]


def _stream(cls: type[HTTPDownstream], session: str) -> HTTPDownstream:
    stream = cls.__new__(cls)  # framing reads only the session's id
    stream.port = SimpleNamespace(id=session)  # type: ignore[assignment]
    return stream


@pytest.mark.parametrize("cls", [SSEStream, NDJSONStream])
@pytest.mark.parametrize("ready", READY)
@pytest.mark.parametrize("session", ["0123456789abcdef", "s-ü"])
def test_frames_is_frame_by_frame(cls, ready, session):
    stream = _stream(cls, session)
    one_by_one = b"".join(stream.frame(seq, data) for seq, data in ready)
    assert stream.frames(ready) == one_by_one
    assert stream.frames(ready) == one_by_one  # again: the SSE event head is kept


def test_sse_event_head_is_the_sessions():
    stream = _stream(SSEStream, "abc")
    assert stream.frames([(5, b"{}")]) == b"id: abc:5\ndata: {}\n\n"
