"""The replay window's copy in Redis, written ahead of the wire by group commit.

A transport hands each batch of stamped messages to ``append`` before writing it; the
batch waits until Redis has it, so a message a client may have seen is always one another
node can replay after this one dies. One flusher greenlet sends every batch that is
waiting in a single pipeline: under load many sessions share one round trip.

While Redis is unreachable nothing waits: sessions keep working from their in-memory
windows and the hub copies each window over again once Redis answers (its recovery).

Nothing a flush meets stops the journal: the script missing from Redis (``SCRIPT FLUSH``,
a restart) is loaded again and the batch retried; any other failure, Redis's or ours, is
logged once, handed to the hub (which reports "degraded" and copies every window over
again) and the flusher carries on; a writer never sees the exception. A state that orjson
cannot encode is written by the standard library's encoder instead, and one nothing can
encode is left out (its messages are still written). Appends are idempotent: the script
skips entries at or below the list's last seq, so a batch that races a full copy of the
window never doubles a message.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Protocol

import gevent
from gevent.event import Event
from gevent.lock import RLock
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .follow import batch_head
from .keys import ENTRY, Keys
from .redis_client import UNAVAILABLE, GeventConnection, pack, text
from .state import StateLine, decode_state, encode_state, export_journaled

__all__ = ["Journal", "decode_state", "encode_state"]

if TYPE_CHECKING:
    import redis

    from ..live import LiveSession

log = logging.getLogger("protoflask.cluster")


class Cursor(Protocol):
    """Where the journal is in one session's messages (the hub keeps it per session)."""

    journaled_seq: int
    committed_seq: int  # the last seq Redis is known to have
    epoch: int  # the session's epoch on this node (the fence its writes carry)

# One call per batch, whatever the number of sessions in it (redis-py spends most of a
# command's cost packing its arguments, so fewer, larger arguments are much cheaper).
# KEYS: replay list and session hash of each session, in pairs. ARGV: max entries, ttl ms,
# this node's id, then per session one blob, newline-separated (orjson never writes a raw
# newline): "epoch first_seq" (then " connected transport" when the record's fields are
# due: an attach or a detach since), its state JSON, then its packed entries. A session
# another node has taken over (the record names another node, or another epoch: the
# fence) is left alone, and so is one whose record is gone (Redis lost its data): the
# script returns the positions of the first, and of the second negated. Entries at or
# below the list's last seq are already there (a full copy of the window raced this
# batch) and are skipped; entries below first_seq (the oldest seq the in-memory window
# still holds: what replayWindowBytes, replayWindowTime and ACKs left) leave the list as
# they left memory; an empty state (one that could not be encoded) is not written.
APPEND_SCRIPT = """
local window, ttl, node = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local fenced = {}
for i = 4, #ARGV do
  local replay, session = KEYS[2 * i - 7], KEYS[2 * i - 6]
  local blob = ARGV[i]
  local hl = string.find(blob, "\\n", 1, true)
  local epoch, first, connected, transport =
    string.match(string.sub(blob, 1, hl - 1), "^(%d+) (%d+) ?(%d*) ?([%w_-]*)$")
  local held = redis.call('HMGET', session, 'node', 'epoch')
  if not held[1] then
    fenced[#fenced + 1] = 3 - i
  elseif held[1] ~= node or held[2] ~= epoch then
    fenced[#fenced + 1] = i - 3
  else
    local nl = string.find(blob, "\\n", hl + 1, true)
    local last = redis.call('LINDEX', replay, -1)
    local after = last and tonumber(string.match(last, "^%d+")) or -1
    local items = {}
    local pos = nl and nl + 1
    while pos and pos <= #blob do
      local e = string.find(blob, "\\n", pos, true)
      local item = string.sub(blob, pos, (e or #blob + 1) - 1)
      if tonumber(string.match(item, "^%d+")) > after then items[#items + 1] = item end
      pos = e and e + 1
    end
    for j = 1, #items, 4000 do
      redis.call('RPUSH', replay, unpack(items, j, math.min(j + 3999, #items)))
    end
    if #items > 0 then redis.call('LTRIM', replay, -window, -1) end
    first = tonumber(first)
    while true do
      local head = redis.call('LINDEX', replay, 0)
      if not head or tonumber(string.match(head, "^%d+")) >= first then break end
      redis.call('LPOP', replay)
    end
    redis.call('PEXPIRE', replay, ttl)
    local state = string.sub(blob, hl + 1, (nl or #blob + 1) - 1)
    if #state > 0 then redis.call('HSET', session, 'state', state) end
    if #connected > 0 then
      redis.call('HSET', session, 'connected', connected, 'transport', transport)
    end
    redis.call('PEXPIRE', session, ttl)
  end
end
return fenced
"""

WAIT_LIMIT = 2.0  # s a writer waits for Redis before it gives up and carries on


def committed_only(ready: list[tuple[int, bytes]], committed_seq: int) -> bool:
    """Whether every message of ``ready`` is one Redis has already (at or below
    ``committed_seq``). The swap point of the committed fast path: with ``False`` every
    append waits for its batch, as before it (tests/cluster/test_journal_committed.py)."""
    return max(seq for seq, _ in ready) <= committed_seq


def committed_to(batch: dict[str, tuple["LiveSession", list[bytes]]],
                 fenced: set[str]) -> None:
    """A batch is in Redis: each session's cursor learns the last seq it wrote."""
    for sid, (live, entries) in batch.items():
        if entries and sid not in fenced:
            link = live.link
            if link is not None and hasattr(link, "committed_seq"):
                last = entries[-1]
                seq = int(last[:last.index(b" ")])
                if seq > link.committed_seq:
                    link.committed_seq = seq


def _release(committed: Event, thens: list[Callable[[], None]]) -> None:
    """A batch is written, or given up on: release its waiting writers and run what the
    others left (each once: the give-up timer and the flush may both come)."""
    committed.set()
    waiting = thens[:]
    thens.clear()
    for then in waiting:
        try:
            then()
        except Exception:  # noqa: BLE001 - one writer's failure is not the batch's
            log.exception("journal: a writer's continuation failed")


class _Followed:
    """What the journal keeps of a session it writes, until it forgets the session: its
    two keys, encoded and as the command's arguments (every batch names them), and its
    state's line (``StateLine``)."""

    __slots__ = ("keys", "packed_keys", "line")

    def __init__(self, keys: tuple[bytes, bytes], line: StateLine) -> None:
        self.keys = keys
        self.packed_keys = pack(list(keys), head=False)
        self.line = line


class Journal:
    def __init__(self, redis_client: "redis.Redis", keys: Keys, node_id: str, window_size: int,
                 ttl_ms: int, on_failure: Callable[[BaseException], None],
                 on_fenced: Callable[[list[str], list[str]], None]) -> None:
        self.redis = redis_client
        self.keys = keys
        self.node_id = node_id
        # (sessions another node took over, sessions whose record is gone): the hub drops
        # the first and copies the second over again
        self.on_fenced = on_fenced
        self.window_size = window_size
        self.ttl_ms = ttl_ms
        # the hub marks itself degraded and copies every window over again later
        self.on_failure = on_failure
        # degraded: append() writes nothing; the hub's recovery copies every window again
        self.paused = False
        #: why the last flush failed ("Type: message"), None once one succeeds again
        self.failing: str | None = None
        self.restarts = 0  # times a dead flusher greenlet had to be started again
        self._sha: str | None = None  # loaded once; again after Redis restarts empty
        self._batch: dict[str, tuple["LiveSession", list[bytes]]] = {}
        self._committed = Event()
        # what runs once the batch is written (or given up on): writers that did not wait
        # (append's ``then``), each run once, in the order they came
        self._then: list[Callable[[], None]] = []
        # one give-up timer per batch (started by its first waiting writer), rather than a
        # Timeout per writer: the writers of a batch all wait on the same commit
        self._give_up: Any = None
        self._work = Event()
        self._order = RLock()  # one batch written at a time, in order (flush)
        self._running = False  # between start() and stop(): a flusher greenlet writes
        self._flusher: gevent.Greenlet | None = None
        self._unencodable: set[str] = set()  # sessions whose state was left out (logged)
        #: what the journal keeps of each session it wrote, until it is forgotten
        self._followed: dict[str, _Followed] = {}
        # the flusher's own connection for the short way (redis_client.execute_packed),
        # with the process that took it and whether a write is on it now (a second
        # flush meanwhile, from another greenlet, goes redis-py's way)
        self._conn: GeventConnection | None = None
        self._conn_pid = 0
        self._conn_busy = False
        #: the script's arguments that do not change (window, ttl, node), and packed
        self._constant: tuple[list[bytes], bytes] = ([], b"")

    def start(self) -> None:
        self._running = True
        if self._flusher is None or self._flusher.dead:
            self._flusher = gevent.spawn(self._flush_forever)

    def stop(self) -> None:
        self._running = False
        self.flush()
        if self._flusher is not None:
            self._flusher.kill(block=False)
            self._flusher = None
        conn, self._conn = self._conn, None
        if conn is not None and not self._conn_busy:
            self.redis.connection_pool.release(conn)

    @property
    def alive(self) -> bool:
        """False while the journal cannot write: its last flush failed, or its flusher is
        dead (then the next append starts it again)."""
        return self.failing is None and not (
            self._running and (self._flusher is None or self._flusher.dead))

    def resumed(self) -> None:
        """The hub copied every window over again: journal from here on."""
        self.failing = None
        self.paused = False

    def append(self, live: "LiveSession", cursor: Cursor, ready: list[tuple[int, bytes]],
               now: int, then: Callable[[], None] | None = None) -> None:
        """Journal a batch of (seq, data) messages stamped at ``now``; returns once Redis
        has them, or after WAIT_LIMIT. Never raises: a failure degrades the hub, which
        copies the window over again once Redis takes writes. Replays of messages already
        journaled (at or below ``cursor``'s seq) are skipped.

        With ``then``, returns at once instead, and ``then()`` runs once Redis has them
        (or after WAIT_LIMIT), in the greenlet that wrote the batch or in the loop's
        timer: it must not block. A writer saves its two greenlet switches that way."""
        if self.paused:
            if then is not None:
                then()
            return
        if ready and committed_only(ready, cursor.committed_seq):
            # a replay of what Redis has already (a resume): its state goes with the
            # next batch, the messages to the wire now
            self.note_state(live)
            if then is not None:
                then()
            return
        sid = live.core.id
        pending = self._batch.get(sid)
        if pending is None:  # the session's first append to this batch
            entries: list[bytes] = []
            self._batch[sid] = (live, entries)
            self._work.set()
        else:
            entries = pending[1]
        journaled = cursor.journaled_seq
        for seq, data in ready:
            if seq > journaled:
                entries.append(ENTRY % (seq, now, data))
                journaled = seq
        cursor.journaled_seq = journaled
        committed = self._committed
        if then is not None:
            self._then.append(then)
        if not self._running:
            self.flush()  # not serving yet (or stopping): write through
            return
        if self._flusher is None or self._flusher.dead:
            self.restarts += 1
            log.error("the journal's flusher had died; started again")
            self._flusher = gevent.spawn(self._flush_forever)
        if self._give_up is None and committed is self._committed:  # (not flushed since)
            self._give_up = gevent.get_hub().loop.timer(WAIT_LIMIT)
            self._give_up.start(self._gave_up, committed, self._then)
        if then is None:
            committed.wait()

    def _gave_up(self, committed: Event, thens: list[Callable[[], None]]) -> None:
        """A batch waited WAIT_LIMIT (to be written, or for its write): its writers carry
        on. One still waiting to be written (the flusher stuck on the batch before it)
        takes more writers: they get a timer of their own, not none."""
        if committed is self._committed:
            self._give_up = None
        _release(committed, thens)

    def forget(self, session_id: str) -> None:
        """The session is gone: drop what the journal remembers of it."""
        self._unencodable.discard(session_id)
        self._followed.pop(session_id, None)

    def note_state(self, live: "LiveSession") -> None:
        """Write the session's state with the next batch even if it sends nothing."""
        if not self.paused:
            self._entries_for(live)
            self._work.set()

    def _entries_for(self, live: "LiveSession") -> list[bytes]:
        pending = self._batch.get(live.id)
        if pending is None:
            pending = self._batch[live.id] = (live, [])
        return pending[1]

    def _flush_forever(self) -> None:
        while True:
            self._work.wait()
            self._work.clear()
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - flush handles its failures; never die here
                log.exception("journal flush failed unexpectedly")

    def holds(self, session_id: str) -> bool:
        """Whether messages of the session wait to be written (stamped since the last
        batch was taken)."""
        pending = self._batch.get(session_id)
        return pending is not None and bool(pending[1])

    def ordered(self) -> RLock:
        """Held, no batch is written: entered once the batch being written is (what was
        appended before is in Redis, or failed); a write made meanwhile (a window copied
        over whole) lands after everything appended before it and before anything after."""
        return self._order

    def flush(self) -> None:
        """Send everything waiting in one pipeline and release its writers; returns once
        what was appended before the call is written (or failed). Never raises: a
        failure is logged (once, until a flush succeeds again) and handed to the hub.

        One flush writes at a time, the batches in the order they were taken: a batch
        taken later and written first would have Redis skip the earlier one's entries
        (the list's last seq is past them), and a let-go written while a batch of its
        session is still on the way would name seqs Redis does not have yet."""
        with self._order:
            self._flush()

    def _flush(self) -> None:
        batch, self._batch = self._batch, {}
        committed, self._committed = self._committed, Event()
        thens, self._then = self._then, []
        # the batch's give-up timer runs on while it is written: a Redis that stopped
        # answering holds the write until the socket's timeout, its writers WAIT_LIMIT
        give_up, self._give_up = self._give_up, None
        if not batch:
            if give_up is not None:
                give_up.close()
            _release(committed, thens)
            return
        try:
            fenced = self._write(batch)
        except Exception as exc:  # noqa: BLE001 - Redis's or ours: the writers carry on
            self._failed(exc)
        else:
            committed_to(batch, fenced)
            if self.failing is not None and not self.paused:
                log.warning("the journal writes again")
                self.failing = None
        finally:
            if give_up is not None:
                give_up.close()
            _release(committed, thens)

    def _failed(self, exc: Exception) -> None:
        """Forget the script (a restarted Redis has lost it), remember why, log the first
        failure of a series, and let the hub degrade and copy every window over again."""
        self._sha = None
        if self.failing is None:
            if isinstance(exc, UNAVAILABLE):
                log.error("journal: Redis is unreachable (%s)", exc)
            else:
                log.error("journal: a write failed; the node is degraded until every "
                          "window is copied over again", exc_info=exc)
        self.failing = f"{type(exc).__name__}: {exc}"
        self.on_failure(exc)

    def state_of(self, live: "LiveSession", texts: bool = False) -> bytes:
        """The session's state for Redis (with ``texts``, its open texts too: a hand-over);
        empty (left out, logged once) if nothing can encode it."""
        followed = self._followed.get(live.id)
        return self._encoded(live, followed.line if followed is not None and not texts
                             and followed.line.core is live.core else None, texts)

    def _encoded(self, live: "LiveSession", line: StateLine | None,
                 texts: bool = False) -> bytes:
        """The state by its line if the journal keeps one (not while the session has ids
        of deliveries from other nodes to carry), else exported and encoded."""
        delivered = getattr(live.link, "delivered", None)  # (routing.Follow)
        try:
            blob = line.encode() if line is not None and not delivered else \
                encode_state(export_journaled(live.core, texts, delivered or ()))
        except Exception as exc:  # noqa: BLE001 - the messages still go to Redis
            if live.id not in self._unencodable:
                self._unencodable.add(live.id)
                log.error("session %s: its state cannot be encoded (%s); its messages are "
                          "journaled, its state in Redis stays as it was", live.id, exc)
            return b""
        if self._unencodable:
            self._unencodable.discard(live.id)
        return blob

    def _write(self, batch: dict[str, tuple["LiveSession", list[bytes]]]) -> set[str]:
        """Write the batch; returns the sessions the script left alone (fenced)."""
        # EVALSHA, not redis-py's Script objects: those ask SCRIPT EXISTS on each call.
        if self._sha is None:
            self._sha = text(self.redis.script_load(APPEND_SCRIPT))
        # made once: it takes the records due (``batch_head``), so a retry sends the same
        command = self._command(batch, self._sha)
        try:
            fenced = self._evalsha(*command)
        except NoScriptError:  # SCRIPT FLUSH, or Redis restarted: load it again (the SHA
            # is the script's own: the command stays as it is)
            self._sha = text(self.redis.script_load(APPEND_SCRIPT))
            fenced = self._evalsha(*command)
        if not fenced:
            return set()
        sids = list(batch)
        if log.isEnabledFor(logging.DEBUG):
            for i in fenced:
                entries = batch[sids[abs(i) - 1]][1]
                log.debug("journal: session %s %s; %d entries not written (%s-%s)",
                          sids[abs(i) - 1], "taken" if i > 0 else "gone", len(entries),
                          entries[0].split(b" ", 1)[0].decode() if entries else "",
                          entries[-1].split(b" ", 1)[0].decode() if entries else "")
        taken = [sids[i - 1] for i in fenced if i > 0]
        lost = [sids[-i - 1] for i in fenced if i < 0]
        self.on_fenced(taken, lost)
        return {*taken, *lost}

    def _command(self, batch: dict[str, tuple["LiveSession", list[bytes]]], sha: str
                 ) -> tuple[list[bytes], bytes]:
        """The batch's EVALSHA: its arguments, and packed (as ``pack(args)``)."""
        known = self._followed
        keys: list[bytes] = []
        packed_keys: list[bytes] = []  # the same, as kept packed
        blobs: list[bytes] = []
        for sid, (live, entries) in batch.items():
            followed = known.get(sid)
            if followed is None or followed.line.core is not live.core:
                followed = known[sid] = _Followed(
                    (self.keys.replay(sid).encode(), self.keys.session(sid).encode()),
                    StateLine(live.core))
            keys += followed.keys
            packed_keys.append(followed.packed_keys)
            blobs.append(b"\n".join((batch_head(live), self._encoded(live, followed.line),
                                     *entries)))
        constant = [b"%d" % self.window_size, b"%d" % self.ttl_ms, self.node_id.encode()]
        if self._constant[0] != constant:
            self._constant = (constant, pack(constant, head=False))
        args = [b"EVALSHA", sha.encode(), b"%d" % len(keys), *keys, *constant, *blobs]
        # packed from the parts kept packed
        return args, b"".join((b"*%d\r\n" % len(args), pack(args[:3], head=False),
                               *packed_keys, self._constant[1], pack(blobs, head=False)))

    def _evalsha(self, args: list[bytes], packed: bytes | None = None) -> Any:
        """Run the EVALSHA (``args``; ``packed``: the same, already packed) on the
        flusher's own connection, or, when that connection is lost (Redis restarted, say)
        or busy, the long way through redis-py, which reconnects and retries. An error
        reply (NOSCRIPT...) raises either way."""
        conn = self._own_connection()
        if conn is not None:
            self._conn_busy = True
            try:
                return conn.execute_packed(packed if packed is not None else pack(args))
            except RedisTimeoutError:
                raise  # a Redis that does not answer: a new connection would wait as long
            except UNAVAILABLE:
                pass
            finally:
                self._conn_busy = False
        return self.redis.evalsha(text(args[1]), int(args[2]), *args[3:])

    def _own_connection(self) -> GeventConnection | None:
        if self._conn_busy:
            return None
        if self._conn is not None and self._conn_pid == os.getpid():
            return self._conn
        self._conn = None  # (a connection of the process this one forked from is not ours)
        try:
            conn = self.redis.connection_pool.get_connection()
        except UNAVAILABLE:
            return None
        if not isinstance(conn, GeventConnection):
            self.redis.connection_pool.release(conn)
            return None
        self._conn, self._conn_pid = conn, os.getpid()
        return conn
