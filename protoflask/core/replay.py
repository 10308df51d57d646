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

What every entry of a small window repeats is kept once (issue 29: an idle session's
window is its HELLO reply and a PING per heartbeat): the copy kept has the session id
(twice in every envelope) as the byte 0x00, and a HELLO reply's capabilities and type
list (two thirds of its ~820 bytes, the same for every session of a worker) as 0x01 and
0x02, the segments held once (``shared``). JSON has no raw control character (orjson
escapes every one), so putting them back is exact; an entry that has one anyway is kept
as it came. Sizes, offsets and the byte bounds count the message as written, never the
copy kept. A window past SMALL_WINDOW (a busy session's) keeps its new entries as
written: the marks would cost each of its messages ~3% of a PING's instructions.
Without a session id (``session_id=""``) nothing is compacted: the plain window
(tests/core/test_replay.py runs the same cases over both).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator, NamedTuple


class Stored(NamedTuple):
    seq: int
    stored_at: int  # ms
    data: bytes  # the encoded envelope, written again verbatim on replay


#: entries a window holds as a list before it becomes a deque (a list's popleft moves
#: them all: cheap for a few)
SMALL_WINDOW = 16
#: (seq, stored_at, data, offset): data as written; or, with a fifth item, data with the
#: session id as SID_MARK and that item's segments (a ``shared`` tuple, or none) marked
_Entry = tuple[Any, ...]
SID_MARK = b"\x00"
#: the marks of a ``shared`` tuple's segments, in order
SEGMENT_MARKS = tuple(bytes((i,)) for i in range(1, 32))
SID_ONLY: tuple[bytes, ...] = ()
#: the distinct segment lists kept (a worker has one HELLO reply's; more only with
#: sessions of different settings): past this many, new ones are not compacted
MAX_SHARED = 64
_SHARED: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}
#: The swap point of a segment's search: where it was found last (``_AT``) tried first,
#: a compare of its length, before a ``find`` from the start (its ~830-byte scan was
#: ~1.4% of a WebSocket handshake's instructions, issue 29). Every HELLO reply of a
#: worker has its segments at the same place. Marking another occurrence than the first
#: is as lossless (``_full`` puts a mark back wherever it is); tests/core/test_replay.py
#: runs its cases both ways.
HINTED = True
_AT: dict[bytes, int] = {}
MAX_HINTS = MAX_SHARED * 2


def shared(*segments: bytes) -> tuple[bytes, ...] | None:
    """The one tuple of these segments every window's entries point to (None once
    MAX_SHARED lists were seen, or for an empty segment, which would match anywhere)."""
    got = _SHARED.get(segments)
    if got is None:
        if len(_SHARED) >= MAX_SHARED or not segments or not all(segments) \
                or len(segments) > len(SEGMENT_MARKS):
            return None
        got = _SHARED[segments] = segments
    return got


class ReplayWindow:
    __slots__ = ("size", "time_ms", "max_bytes", "_entries", "_added", "_sid")

    def __init__(self, size: int, time_ms: int, max_bytes: int | None = None,
                 session_id: str = "") -> None:
        self.size = size
        self.time_ms = time_ms
        self.max_bytes = max_bytes
        # the session's own str (no bytes copy kept: that would cost what a PING saves)
        self._sid = session_id
        self._entries: deque[_Entry] | list[_Entry] = []
        # bytes ever added: the next entry's offset; what the window holds is this minus
        # the first entry's offset (no running total to keep as entries come and go)
        self._added = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Stored]:
        full = self._full
        return (Stored(e[0], e[1], full(e)) for e in list(self._entries))

    def _full(self, e: _Entry) -> bytes:
        """The message of an entry as it was written."""
        data: bytes = e[2]
        if len(e) == 4:
            return data
        segments = e[4]
        for i in range(len(segments) - 1, -1, -1):
            data = data.replace(SEGMENT_MARKS[i], segments[i])
        return data.replace(SID_MARK, self._sid.encode())

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

    def add(self, seq: int, data: bytes, now: int,
            segments: tuple[bytes, ...] | None = None) -> bytes:
        """Keep a message (``segments``: a ``shared`` tuple it may hold, a HELLO reply's);
        returns a compact copy of it to write (the original's buffer, orjson's ~4 KiB,
        can then go at once)."""
        data = memoryview(data).tobytes()
        entries = self._entries
        added = self._added
        if type(entries) is list:  # a small window: an idle session's, compacted
            entries.append(self._compacted(seq, now, data, added, segments)
                           if self._sid else (seq, now, data, added))
            if len(entries) > SMALL_WINDOW:
                entries = self._entries = deque(entries)
        else:  # a busy session's: as written (the marks would cost its every message)
            entries.append((seq, now, data, added))
        added += len(data)
        self._added = added
        if len(entries) > self.size:  # the usual eviction, one per message once full
            _popleft(entries)
        if self.max_bytes is not None:
            while added - entries[0][3] > self.max_bytes and len(entries) > 1:
                _popleft(entries)
        if entries[0][1] < now - self.time_ms:
            self.prune(now)
        return data

    def _compacted(self, seq: int, now: int, data: bytes, added: int,
                   segments: tuple[bytes, ...] | None) -> _Entry:
        """The entry of ``data`` with the session id and ``segments`` marked, or as
        written if it has a mark byte already (never in JSON)."""
        segments = segments or SID_ONLY
        # find(), not ``in``: bytes.__contains__ first tries its argument as an int and
        # raises (and clears) a TypeError for a bytes one, ~1.8k instructions each
        # (a loop, not any() over a generator: one object and frame fewer a message)
        if data.find(SID_MARK) >= 0:
            return (seq, now, data, added)
        for mark in SEGMENT_MARKS[:len(segments)]:
            if data.find(mark) >= 0:
                return (seq, now, data, added)
        # the same object back when the id is not in it: nothing more is held then
        kept = data.replace(self._sid.encode(), SID_MARK)
        for mark, segment in zip(SEGMENT_MARKS, segments, strict=False):
            # its first occurrence (a HELLO reply has each once; another would stay as
            # written, and ``_full`` puts a mark back wherever it is): one scan up to it,
            # where replace() scans the whole message twice (count, then copy)
            at = _AT.get(segment, -1) if HINTED else -1
            if at < 0 or not kept.startswith(segment, at):
                at = kept.find(segment)
                if HINTED and at >= 0 and len(_AT) < MAX_HINTS:
                    _AT[segment] = at
            if at >= 0:
                kept = b"".join((kept[:at], mark, kept[at + len(segment):]))
        return (seq, now, kept, added, segments)

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
        full = self._full
        out = [Stored(e[0], e[1], full(e)) for e in self._entries
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
        # (the copies kept may be shorter than the messages: offsets count the messages)
        end: int = entries[j][3] if j < len(entries) else self._added
        start: int = entries[i][3]
        return end - start

    def entry_at(self, i: int) -> tuple[int, bytes]:
        e = self._entries[i]
        return e[0], self._full(e)


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
        # sorted, disjoint, inclusive; a list only while it holds any (``add`` makes it):
        # every session keeps a queue, almost always empty (docs/PERFORMANCE.md, "Fewer
        # objects per session")
        self.ranges: list[tuple[int, int]] | tuple[()] = ()

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def clear(self) -> None:
        self.ranges = ()

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
        if not ranges:
            return out
        assert isinstance(ranges, list)
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
        self.ranges = ()  # all taken
        return out


#: the resend queue of every session that never had a range to write again (an outbound
#: queue makes its own with its first: ``OutboundQueue.queue_replay``); it holds nothing,
#: and ``clear`` leaves it so
NO_RESENDS = ResendQueue()
