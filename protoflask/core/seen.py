"""Which upstream seqs a session has seen (docs/PROTOCOL.md §2.2 Sequence numbers).

Upstream seq belongs to the session: it rises, gaps are allowed, and messages may arrive
out of seq order (a browser's concurrent POSTs do). Only a seq already seen is a
retransmission. The session remembers, for the ``WINDOW`` seqs below the highest seen,
which were not seen yet; a seq further down counts as seen (a retransmission).

One integer holds that memory: bit ``k`` (1..WINDOW) is set while seq ``highest - k`` has
not been seen. A client that sends in order keeps it at 0, so the common case costs
nothing; the worst case is a WINDOW-bit integer (about 160 bytes) per session.

A message that arrives ahead of a missing lower seq is processed at once, not held: gaps
are allowed, so a missing seq may never come, and holding would delay every message of a
client that skips seqs. Order is kept within what one connection, one POST body or one
duplex stream carries; a client that POSTs concurrently sends a text's START/PART/END in
one body (or waits for each 202).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

#: how many seqs below the highest are remembered individually (at least 1024)
WINDOW = 1024
_ALL = ((1 << WINDOW) - 1) << 1  # bits 1..WINDOW


class SeenMemory:
    """What SeenSeqs does, over the ``highest`` and ``_missing`` of whatever it is mixed
    into (no slots of its own): a session keeps them as slots of its own, no object more
    (core/parts.py); ``SeenSeqs`` below is the memory on its own."""

    if not TYPE_CHECKING:  # no slots of its own (mypy would take them for its fields')
        __slots__ = ()

    highest: int
    _missing: int

    def remember(self, highest: int = 0, missing: Iterable[int] = ()) -> None:
        """Start over: ``highest`` seen, ``missing`` (below it) not seen yet."""
        self.highest = highest
        self._missing = 0
        for seq in missing:
            k = highest - seq
            if 0 < k <= WINDOW:
                self._missing |= 1 << k

    def first_time(self, seq: int) -> bool:
        """Record ``seq``: True the first time it is seen (process the message), False
        for a retransmission (drop it)."""
        highest = self.highest
        if seq > highest:
            rise = seq - highest
            if rise > WINDOW:  # every seq of the window is above the old highest
                self._missing = _ALL
            elif rise == 1:
                if self._missing:
                    self._missing = (self._missing << 1) & _ALL
            else:  # the seqs skipped over are not seen yet
                self._missing = ((self._missing << rise)
                                 | (((1 << (rise - 1)) - 1) << 1)) & _ALL
            self.highest = seq
            return True
        bit = 1 << (highest - seq) if 0 < highest - seq <= WINDOW else 0
        if self._missing & bit:
            self._missing ^= bit
            return True
        return False

    def all_seen(self) -> bool:
        """No seq below the highest, within the window, is missing (``missing()`` is [])."""
        return not self._missing

    def missing(self) -> list[int]:
        """Seqs below the highest, within the window, not seen yet (ascending)."""
        out = []
        bits = self._missing
        while bits:  # one turn per missing seq (highest first), not per bit of the window
            low = bits & -bits
            out.append(self.highest - low.bit_length() + 1)
            bits ^= low
        out.reverse()
        return out


class SeenSeqs(SeenMemory):
    __slots__ = ("highest", "_missing")

    def __init__(self, highest: int = 0, missing: Iterable[int] = ()) -> None:
        self.remember(highest, missing)
