"""The replay window: a session's last downstream messages, bounded by count and age.

Entries are kept in seq order (seqs only rise, so a deque is enough). ``ACK``
drops a prefix; ``range`` answers a resume or a REPLAY_REQUEST in numeric order.

Entries are plain ``(seq, stored_at, data)`` tuples, which the garbage collector stops
tracking (a window of a thousand dataclass instances per session made every full
collection scan them all), and ``data`` is a compact copy: orjson's output buffers carry
about 4 KiB each however short the message, which a window would otherwise keep alive.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, NamedTuple


class Stored(NamedTuple):
    seq: int
    stored_at: int  # ms
    data: bytes  # the encoded envelope, written again verbatim on replay


class ReplayWindow:
    def __init__(self, size: int, time_ms: int) -> None:
        self.size = size
        self.time_ms = time_ms
        self._entries: deque[tuple[int, int, bytes]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Stored]:
        return (Stored(*e) for e in list(self._entries))

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def first_seq(self) -> int | None:
        return self._entries[0][0] if self._entries else None

    def add(self, seq: int, data: bytes, now: int) -> None:
        data = memoryview(data).tobytes()
        entries = self._entries
        entries.append((seq, now, data))
        self._bytes += len(data)
        if len(entries) > self.size:
            self._drop_first()
        if entries[0][1] < now - self.time_ms:
            self.prune(now)

    def prune(self, now: int) -> None:
        """Drop entries older than the window's time."""
        horizon = now - self.time_ms
        entries = self._entries
        while entries and entries[0][1] < horizon:
            self._drop_first()

    def ack(self, seq: int) -> None:
        """Drop everything up to and including ``seq``."""
        entries = self._entries
        while entries and entries[0][0] <= seq:
            self._drop_first()

    def range(self, from_seq: int, to_seq: int | None = None) -> tuple[list[Stored], bool]:
        """Stored messages with from_seq <= seq <= to_seq, and whether the window still
        held ``from_seq`` (False means messages before the first returned one are lost)."""
        out = [Stored(*e) for e in self._entries
               if e[0] >= from_seq and (to_seq is None or e[0] <= to_seq)]
        first = self.first_seq
        complete = first is not None and first <= from_seq
        return out, complete

    def _drop_first(self) -> None:
        self._bytes -= len(self._entries.popleft()[2])
