"""Upstream HTTP input, sans-I/O: how a POST body splits into messages (one envelope, a
JSON array or NDJSON) with their sizes for credit, and how a seq written as text (a
``last_seq`` query argument, a Last-Event-ID, the dashboard's ``since``) is read.

The HTTP transports read the bytes; the engine hands the parts to the session
(``Engine.receive_body``); a cluster node that receives a body another node took uses
the same path, so a body means the same thing wherever it is processed.
"""

from __future__ import annotations

from typing import Any, Iterator

import orjson

from .envelope import MAX_SEQ, SEQ_DIGITS
from .errors import InvalidMessage

#: One message of a body: a decoded JSON value and its size in bytes for credit, or
#: (raw bytes, their length) for a message the session is to parse itself (a body that is
#: one envelope, an NDJSON line that is not JSON). A decoded value is never ``bytes``.
Part = tuple[Any, int]

_NOT_JSON = object()

#: What ``iter_body`` yields between parts where the caller may take a turn for other work
#: (the engine lets other greenlets run): a body's parts are decoded one at a time, and
#: the scan that decides whether a body is readable at all pauses every ``SCAN_SLICE``
#: lines, so no part of a body holds the worker for longer than one slice.
TURN = None
#: Lines tried per slice while scanning a body that may not be JSON at all (a failed
#: decode costs about 5 us: 256 of them are about a millisecond).
SCAN_SLICE = 256


def split_body(body: bytes) -> list[Part]:
    """A POST body's messages, in order (see ``Part``), all at once (``iter_body``
    without its turns)."""
    return [part for part in iter_body(body) if part is not TURN]


def iter_body(body: bytes) -> Iterator[Part | None]:
    """A POST body's messages, in order (see ``Part``), decoded one by one as they are
    asked for, with ``TURN`` where the caller may let other work run.

    The body is one JSON value (an envelope, or an array of envelopes) or NDJSON. A body
    of which no line is JSON at all raises InvalidMessage before any part is yielded (the
    caller reports it to the session as one unreadable message)."""
    lines = _ndjson_lines(body)
    if lines is not None:
        yield from _line_parts(lines)
        return
    whole = _loads(body)
    if isinstance(whole, list):
        for item in whole:
            yield (item, _encoded_size(item, len(body)))
        return
    if whole is not _NOT_JSON:
        yield (body, len(body))  # one envelope: the session's own parser reads it
        return
    stripped = [line.strip() for line in body.split(b"\n")]
    stripped = [line for line in stripped if line]
    first = None
    for i, line in enumerate(stripped):
        if i and i % SCAN_SLICE == 0:
            yield TURN
        obj = _loads(line)
        if obj is not _NOT_JSON:
            first = i, obj
            break
    if first is None:
        raise InvalidMessage("the body is not JSON, a JSON array or NDJSON")
    at, obj = first
    for line in stripped[:at]:
        yield (line, len(line))
    yield (obj, len(stripped[at]))
    yield from _line_parts([(line, _UNDECODED) for line in stripped[at + 1:]])


_UNDECODED = object()


def _ndjson_lines(body: bytes) -> list[tuple[bytes, Any]] | None:
    """The common NDJSON body's non-blank lines (stripped), the first one decoded, without
    first trying the whole body as one JSON value; or None when that try is needed
    (``iter_body`` then does it all).

    When at least two lines are not blank and the first of them is a JSON value on its
    own, the whole body cannot be one JSON value: that value ends where its line does
    (a newline ends a number or a literal, and a string, array or object has closed),
    and non-blank bytes follow it (orjson refuses trailing data). So the answer is the
    NDJSON one, and since the first line is JSON it is never InvalidMessage. The whole
    body's try failed only after parsing that first line, building an exception with
    the body decoded to text: most of the cost on such a body."""
    if body.find(b"\n") < 0:
        return None
    lines = [line.strip() for line in body.split(b"\n")]
    lines = [line for line in lines if line]
    if len(lines) < 2:
        return None
    first = _loads(lines[0])
    if first is _NOT_JSON:
        return None  # the first line is not JSON: maybe the body is, whole
    return [(lines[0], first)] + [(line, _UNDECODED) for line in lines[1:]]


def _line_parts(lines: list[tuple[bytes, Any]]) -> Iterator[Part]:
    """NDJSON lines as parts, each decoded when it is asked for (one that is not JSON is
    raw: the session parses it itself and reports it)."""
    for line, obj in lines:
        if obj is _UNDECODED:
            obj = _loads(line)
        yield (line, len(line)) if obj is _NOT_JSON else (obj, len(line))


def is_raw(part: Part) -> bool:
    """Whether the session is to parse this part itself (it was not decoded here)."""
    return isinstance(part[0], bytes)


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _encoded_size(item: Any, whole: int) -> int:
    """An array element's size in bytes for credit (arrays carry no per-element bytes,
    so it is encoded again); ``whole`` (the body's size) when it cannot be encoded
    (nested past orjson's limit: the session refuses it anyway)."""
    try:
        return len(orjson.dumps(item))
    except orjson.JSONEncodeError:
        return whole


# -- seqs written as text ----------------------------------------------------------------


def is_seq(value: str) -> bool:
    """ASCII digits only (str.isdigit also takes '²', which int() refuses), a number no
    larger than any seq can be (MAX_SEQ, 2^53-1). Zero and leading zeros are allowed:
    ``last_seq=0`` asks for everything."""
    return 0 < len(value) <= SEQ_DIGITS and value.isascii() and value.isdigit() \
        and int(value) <= MAX_SEQ


def parse_seq_arg(value: str | None, name: str) -> int | None:
    """A seq query argument: None when absent or empty, else its number, or
    InvalidMessage."""
    if value is None or value == "":
        return None
    if not is_seq(value):
        raise InvalidMessage(f"{name} must be a decimal number of at most {MAX_SEQ} "
                             f"(2^53-1), got {value[:80]!r}")
    return int(value)
