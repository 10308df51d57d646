"""The replay window: a session's last downstream messages, bounded by count, bytes and age.

Entries are kept in seq order (seqs only rise, so a deque is enough; a window of a few
entries, an idle session's, is a list: 88 bytes against an empty deque's 760, issue 29,
turned into a deque when it grows past SMALL_WINDOW). ``ACK``
drops a prefix; ``range`` answers a resume or a REPLAY_REQUEST in numeric order, and
``ResendQueue`` writes such a range out a bounded batch at a time.

Entries are plain ``(seq, stored_at, data, offset)`` tuples, which the garbage collector
stops tracking (a window of a thousand dataclass instances per session made every full
collection scan them all), and ``data`` is a compact copy: orjson's output buffers carry
about 4 KiB each however short the message, which a window would otherwise keep alive.
``offset`` is the running total of bytes added before the entry, so the bytes of any run
of entries is a subtraction (what the resend queue counts toward the outbound buffer).

The byte bound (``replayWindowBytes``) evicts the oldest entries, but the newest entry is
always kept, so the window holds at most ``max_bytes`` plus one message.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, NamedTuple


class Stored(NamedTuple):
    seq: int
    stored_at: int  # ms
    data: bytes  # the encoded envelope, written again verbatim on replay


#: entries a window holds as a list before it becomes a deque (a list's popleft moves
#: them all: cheap for a few)
SMALL_WINDOW = 16
_Entry = tuple[int, int, bytes, int]


class ReplayWindow:
    __slots__ = ("size", "time_ms", "max_bytes", "_entries", "_added")

    def __init__(self, size: int, time_ms: int, max_bytes: int | None = None) -> None:
        self.size = size
        self.time_ms = time_ms
        self.max_bytes = max_bytes
        self._entries: deque[_Entry] | list[_Entry] = []
        # bytes ever added: the next entry's offset; what the window holds is this minus
        # the first entry's offset (no running total to keep as entries come and go)
        self._added = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Stored]:
        return (Stored(*e[:3]) for e in list(self._entries))

    @property
    def nbytes(self) -> int:
        entries = self._entries
        return self._added - entries[0][3] if entries else 0

    @property
    def oldest_at(self) -> int | None:
        """When the oldest entry was stored (ms), or None: the window's next prune."""
        return self._entries[0][1] if self._entries else None

    @property
    def first_seq(self) -> int | None:
        return self._entries[0][0] if self._entries else None

    @property
    def last_seq(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    def add(self, seq: int, data: bytes, now: int) -> bytes:
        """Keep a message; returns the compact copy kept (write that one: the original's
        buffer can then go at once)."""
        data = memoryview(data).tobytes()
        entries = self._entries
        added = self._added
        entries.append((seq, now, data, added))
        added += len(data)
        self._added = added
        if len(entries) > SMALL_WINDOW and type(entries) is list:
            entries = self._entries = deque(entries)
        if len(entries) > self.size:  # the usual eviction, one per message once full
            _popleft(entries)
        if self.max_bytes is not None:
            while added - entries[0][3] > self.max_bytes and len(entries) > 1:
                _popleft(entries)
        if entries[0][1] < now - self.time_ms:
            self.prune(now)
        return data

    def prune(self, now: int) -> None:
        """Drop entries older than the window's time."""
        horizon = now - self.time_ms
        entries = self._entries
        while entries and entries[0][1] < horizon:
            _popleft(entries)

    def ack(self, seq: int) -> None:
        """Drop everything up to and including ``seq``."""
        entries = self._entries
        while entries and entries[0][0] <= seq:
            _popleft(entries)

    def range(self, from_seq: int, to_seq: int | None = None) -> tuple[list[Stored], bool]:
        """Stored messages with from_seq <= seq <= to_seq, and whether the window still
        held ``from_seq`` (False means messages before the first returned one are lost)."""
        out = [Stored(*e[:3]) for e in self._entries
               if e[0] >= from_seq and (to_seq is None or e[0] <= to_seq)]
        return out, self.holds(from_seq)

    def holds(self, from_seq: int) -> bool:
        """Whether nothing at or after ``from_seq`` was evicted."""
        first = self.first_seq
        return first is not None and first <= from_seq

    def index(self, seq: int) -> int:
        """Position of the first entry whose seq is >= ``seq`` (len(self) if none)."""
        entries = self._entries
        lo, hi = 0, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if entries[mid][0] < seq:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def bytes_between(self, from_seq: int, to_seq: int) -> int:
        """Bytes of the entries with from_seq <= seq <= to_seq (O(log n))."""
        entries = self._entries
        i, j = self.index(from_seq), self.index(to_seq + 1)
        if i >= j:
            return 0
        last = entries[j - 1]
        return last[3] + len(last[2]) - entries[i][3]

    def entry_at(self, i: int) -> tuple[int, bytes]:
        e = self._entries[i]
        return e[0], e[2]


def _popleft(entries: deque[_Entry] | list[_Entry]) -> None:
    if type(entries) is list:
        del entries[0]
    else:
        entries.popleft()  # type: ignore[union-attr]


class ResendQueue:
    """Seq ranges of the replay window still to be written again, merged: a range that is
    already queued is not queued twice, so whatever a client asks for, the queue never
    holds more than the window (and holds no copy of it: entries are read from the window
    as they are written, a bounded batch at a time). An entry evicted meanwhile (ACKed,
    aged out) is skipped."""

    __slots__ = ("ranges",)

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []  # sorted, disjoint, inclusive

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def clear(self) -> None:
        self.ranges.clear()

    def add(self, lo: int, hi: int) -> None:
        if lo > hi:
            return
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.ranges, (lo, hi)]):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.ranges = merged

    def nbytes(self, window: ReplayWindow) -> int:
        """Bytes the queue still has to write (entries still in the window)."""
        return sum(window.bytes_between(a, b) for a, b in self.ranges)

    def take(self, window: ReplayWindow, limit: int) -> list[tuple[int, bytes]]:
        """The next entries in seq order, up to ``limit`` bytes (at least one entry)."""
        out: list[tuple[int, bytes]] = []
        total = 0
        ranges = self.ranges
        while ranges:
            lo, hi = ranges[0]
            i, n = window.index(lo), len(window)
            while i < n:
                seq, data = window.entry_at(i)
                if seq > hi:
                    break
                if out and total + len(data) > limit:
                    ranges[0] = (seq, hi)
                    return out
                out.append((seq, data))
                total += len(data)
                i += 1
            ranges.pop(0)
        return out
