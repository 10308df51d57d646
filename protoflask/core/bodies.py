"""Upstream HTTP input, sans-I/O: how a POST body splits into messages (one envelope, a
JSON array or NDJSON) with their sizes for credit, and how a seq written as text (a
``last_seq`` query argument, a Last-Event-ID, the dashboard's ``since``) is read.

The HTTP transports read the bytes; the engine hands the parts to the session
(``Engine.receive_body``); a cluster node that receives a body another node took uses
the same path, so a body means the same thing wherever it is processed.
"""

from __future__ import annotations

from typing import Any

import orjson

from .envelope import MAX_SEQ, SEQ_DIGITS
from .errors import InvalidMessage

#: One message of a body: a decoded JSON value and its size in bytes for credit, or
#: (raw bytes, their length) for a message the session is to parse itself (a body that is
#: one envelope, an NDJSON line that is not JSON). A decoded value is never ``bytes``.
Part = tuple[Any, int]

_NOT_JSON = object()


def split_body(body: bytes) -> list[Part]:
    """A POST body's messages, in order (see ``Part``).

    The body is one JSON value (an envelope, or an array of envelopes) or NDJSON. A body
    of which no line is JSON at all raises InvalidMessage (the caller reports it to the
    session as one unreadable message)."""
    parts = _ndjson_parts(body)
    if parts is not None:
        return parts
    whole = _loads(body)
    if isinstance(whole, list):
        return [(item, _encoded_size(item, len(body))) for item in whole]
    if whole is not _NOT_JSON:
        return [(body, len(body))]  # one envelope: the session's own parser reads it
    lines = [line.strip() for line in body.split(b"\n")]
    lines = [line for line in lines if line]
    decoded = [_loads(line) for line in lines]
    if all(obj is _NOT_JSON for obj in decoded):
        raise InvalidMessage("the body is not JSON, a JSON array or NDJSON")
    return [(line, len(line)) if obj is _NOT_JSON else (obj, len(line))
            for line, obj in zip(lines, decoded, strict=True)]


def _ndjson_parts(body: bytes) -> list[Part] | None:
    """The common NDJSON body's parts without first trying the whole body as one JSON
    value, or None when that try is needed (``split_body`` then does it all).

    When at least two lines are not blank and the first of them is a JSON value on its
    own, the whole body cannot be one JSON value: that value ends where its line does
    (a newline ends a number or a literal, and a string, array or object has closed),
    and non-blank bytes follow it (orjson refuses trailing data). So the answer is the
    NDJSON one, and since the first line is JSON it is never InvalidMessage. The whole
    body's try failed only after parsing that first line, building an exception with
    the body decoded to text: most of ``split_body``'s cost on such a body."""
    if body.find(b"\n") < 0:
        return None
    lines = [line for line in body.split(b"\n") if line.strip()]
    if len(lines) < 2:
        return None
    parts: list[Part] = []
    for line in lines:
        line = line.strip()
        try:
            parts.append((orjson.loads(line), len(line)))
        except orjson.JSONDecodeError:
            if not parts:
                return None  # the first line is not JSON: maybe the body is, whole
            parts.append((line, len(line)))
    return parts


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
