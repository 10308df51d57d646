"""The replay window's copy in Redis, written ahead of the wire by group commit.

A transport hands each batch of stamped messages to ``append`` before writing it; the
batch waits until Redis has it, so a message a client may have seen is always one another
node can replay after this one dies. One flusher greenlet sends every batch that is
waiting in a single pipeline: under load many sessions share one round trip.

While Redis is unreachable nothing waits: sessions keep working from their in-memory
windows and the hub copies each window over again once Redis answers (``resync``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import gevent
import orjson
import redis
from gevent.event import Event

from ..core.handoff import export_state
from .keys import Keys, pack_entry
from .redis_client import UNAVAILABLE

if TYPE_CHECKING:
    from ..hub import LiveSession

log = logging.getLogger("protoflask.cluster")

# One call per batch, whatever the number of sessions in it (redis-py spends most of a
# command's cost packing its arguments, so fewer, larger arguments are much cheaper).
# KEYS: replay list and session hash of each session, in pairs. ARGV: max entries, ttl ms,
# this node's id, then per session one blob: its state JSON, then its packed entries,
# newline-separated (orjson never writes a raw newline). A session another node has taken
# over is left alone (fenced), and so is one whose record is gone (Redis lost its data):
# the script returns the positions of the first, and of the second negated.
APPEND_SCRIPT = """
local window, ttl, node = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local fenced = {}
for i = 4, #ARGV do
  local replay, session = KEYS[2 * i - 7], KEYS[2 * i - 6]
  local holder = redis.call('HGET', session, 'node')
  if not holder then
    fenced[#fenced + 1] = 3 - i
  elseif holder ~= node then
    fenced[#fenced + 1] = i - 3
  else
    local blob = ARGV[i]
    local nl = string.find(blob, "\\n", 1, true)
    local items = {}
    local pos = nl and nl + 1
    while pos and pos <= #blob do
      local e = string.find(blob, "\\n", pos, true)
      items[#items + 1] = string.sub(blob, pos, (e or #blob + 1) - 1)
      pos = e and e + 1
    end
    for j = 1, #items, 4000 do
      redis.call('RPUSH', replay, unpack(items, j, math.min(j + 3999, #items)))
    end
    if #items > 0 then redis.call('LTRIM', replay, -window, -1) end
    redis.call('PEXPIRE', replay, ttl)
    redis.call('HSET', session, 'state', nl and string.sub(blob, 1, nl - 1) or blob)
    redis.call('PEXPIRE', session, ttl)
  end
end
return fenced
"""

WAIT_LIMIT = 2.0  # s a writer waits for Redis before it gives up and carries on


class Journal:
    def __init__(self, redis_client: "redis.Redis", keys: Keys, node_id: str, window_size: int,
                 ttl_ms: int, on_failure: Callable[[BaseException, set[str]], None],
                 on_fenced: Callable[[list[str], list[str]], None]) -> None:
        self.redis = redis_client
        self.keys = keys
        self.node_id = node_id
        # (sessions another node took over, sessions whose record is gone): the hub drops
        # the first and copies the second over again
        self.on_fenced = on_fenced
        self.window_size = window_size
        self.ttl_ms = ttl_ms
        self.on_failure = on_failure  # the hub marks itself degraded and resyncs later
        self.paused = False  # degraded: append() only remembers nothing, resync covers it
        self._sha: str | None = None  # loaded once; again after Redis restarts empty
        self._batch: dict[str, tuple["LiveSession", list[bytes]]] = {}
        self._committed = Event()
        self._work = Event()
        self._flusher: gevent.Greenlet | None = None
        self.batches = 0  # pipelines sent (for the benchmark's figures)

    def start(self) -> None:
        if self._flusher is None or self._flusher.dead:
            self._flusher = gevent.spawn(self._flush_forever)

    def stop(self) -> None:
        self.flush()
        if self._flusher is not None:
            self._flusher.kill(block=False)
            self._flusher = None

    def append(self, live: "LiveSession", ready: list[tuple[int, bytes]], now: int) -> None:
        """Journal a batch of (seq, data) messages stamped at ``now``; returns once Redis
        has them. Replays of messages already journaled are skipped."""
        if self.paused:
            return
        entries = self._entries_for(live)
        for seq, data in ready:
            if seq > live.journaled_seq:
                entries.append(pack_entry(seq, now, data))
                live.journaled_seq = seq
        committed = self._committed
        self._work.set()
        if self._flusher is None or self._flusher.dead:
            self.flush()  # not serving yet (or stopping): write through
        else:
            committed.wait(WAIT_LIMIT)

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
            self.flush()

    def flush(self) -> None:
        """Send everything waiting in one pipeline and release its writers."""
        batch, self._batch = self._batch, {}
        committed, self._committed = self._committed, Event()
        if not batch:
            committed.set()
            return
        try:
            try:
                self._write(batch)
            except redis.NoScriptError:
                self._sha = None
                self._write(batch)
            self.batches += 1
        except UNAVAILABLE as exc:
            self.on_failure(exc, set(batch))
        finally:
            committed.set()

    def _write(self, batch: dict[str, tuple["LiveSession", list[bytes]]]) -> None:
        # EVALSHA, not redis-py's Script objects: those ask SCRIPT EXISTS on each call.
        if self._sha is None:
            self._sha = self.redis.script_load(APPEND_SCRIPT)
        keys: list[str] = []
        blobs: list[bytes] = []
        for sid, (live, entries) in batch.items():
            keys += (self.keys.replay(sid), self.keys.session(sid))
            blobs.append(b"\n".join((orjson.dumps(export_state(live.core)), *entries)))
        fenced = self.redis.evalsha(self._sha, len(keys), *keys, self.window_size, self.ttl_ms,
                                    self.node_id, *blobs)
        if fenced:
            sids = list(batch)
            self.on_fenced([sids[i - 1] for i in fenced if i > 0],
                           [sids[-i - 1] for i in fenced if i < 0])
