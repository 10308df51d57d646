"""A session's exported state as the line of JSON the journal writes to Redis.

``encode_state`` / ``decode_state`` are the format; ``StateLine`` writes one session's
line again and again (the journal sends it with every batch that session is in) without
exporting and encoding the whole state each time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from ..core.handoff import export_state

if TYPE_CHECKING:
    from ..core.session import ProtocolSession


def encode_state(state: dict[str, Any]) -> bytes:
    """A session's exported state as one line of JSON: orjson's, or where orjson refuses
    a value (an integer beyond 64 bits, say) the standard library's, which writes any
    integer exactly and anything else as its ``str``. Raises only for a state no encoder
    can write (a reference cycle)."""
    try:
        return orjson.dumps(state)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(state, default=str, separators=(",", ":")).encode()


def export_journaled(core: "ProtocolSession", texts: bool = False,
                     delivered: Iterable[str] = ()) -> dict[str, Any]:
    """``export_state`` plus, when there are any, the messages queued but not stamped
    yet (``pending``). A batch writes the state as it is when it is flushed, which may be
    ahead of what it journals: a TOOL_CALL answered at once (an inline tool) is closed
    and its seq seen while its TOOL_DONE waits for a busy writer or for credit. A node
    writes to the wire only what is journaled, so a node taking the session over from
    this state sends these as new messages: none of them reached the client. ``texts``:
    the open texts too (``export_state``), for a hand-over. ``delivered``: the ids of the
    last deliveries from other nodes applied to the session (``Follow.delivered``), so
    the next holder skips a copy of one of them."""
    state = export_state(core, texts)
    if core.outbound.pending:
        state["pending"] = core.outbound.export_pending()
    if delivered:
        state["delivered"] = list(delivered)
    return state


def decode_state(raw: bytes | str) -> dict[str, Any]:
    """The inverse of ``encode_state``. The standard library's decoder, not orjson's:
    orjson reads an integer beyond 64 bits as a float (it loses digits)."""
    state: dict[str, Any] = json.loads(raw)
    return state


# The exported fields that move with nearly every message, in export_state's order: a
# StateLine keeps the rest of the line encoded and writes these numbers into it.
MOVING = ("last_activity", "upstream_seq", "downstream_seq", "last_ack", "counter")
_HOLE = "\x00hole"  # a placeholder no exported number can be; orjson writes "\u0000hole"
_HOLE_JSON = b'"\\u0000hole"'


class StateLine:
    """``encode_state(export_state(core))``, byte for byte, for a session whose line is
    written again and again.

    While the rest of its state stays as it was the last time (no channel has a credit
    account, no run or tool call is open, the client paused nothing and no upstream seq
    is missing: a session passing control messages, PING among them), only MOVING's
    numbers are formatted into the line kept from then: a fifth of the cost of exporting
    and encoding it all. Anything else is exported and encoded whole, as before."""

    __slots__ = ("core", "_key", "_template")

    def __init__(self, core: "ProtocolSession") -> None:
        self.core = core
        self._key: tuple[Any, ...] | None = None
        self._template = b""  # the line with "%d" for each of MOVING's numbers

    def encode(self) -> bytes:
        core = self.core
        credits = core.credits.plain()
        outbound = core.outbound
        if credits is None or core.has_work or outbound.paused_by_client \
                or outbound.pending or not core.up_seqs.all_seen():
            return encode_state(export_journaled(core))
        # what the rest of the line is made of (id and user never change)
        key = (core.handshake_completed, core.accept_events, credits)
        if key != self._key:
            template = self._template_of(core)
            if template is None:
                return encode_state(export_state(core))
            self._key, self._template = key, template
        return self._template % (core.last_activity, core.up_seqs.highest,
                                 outbound.downstream_seq, core.last_ack, core.id_counter)

    @staticmethod
    def _template_of(core: "ProtocolSession") -> bytes | None:
        """The session's line with a ``%d`` where each of MOVING's numbers goes; None
        when it cannot be made so (a number that is not an int, a string field that
        reads as the placeholder, a state orjson cannot encode)."""
        state = export_state(core)
        if [name for name in state if name in MOVING] != list(MOVING):
            return None
        for name in MOVING:
            if type(state[name]) is not int:
                return None
            state[name] = _HOLE
        try:
            line = orjson.dumps(state)
        except TypeError:
            return None
        parts = line.replace(b"%", b"%%").split(_HOLE_JSON)
        if len(parts) != len(MOVING) + 1:
            return None
        return b"%d".join(parts)
