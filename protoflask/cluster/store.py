"""What a cluster hub keeps in Redis, as named operations: each session's record, its
queued deliveries, the claim lock, one-shot replies, node beats and pub/sub. The Lua
scripts that make a move atomic live here; the key layout is in ``keys``; the replay
window's group-committed writes are the journal's (``journal``).

Nothing here decides anything: the hub calls these and handles ``UNAVAILABLE``.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator, cast

import gevent
import orjson

from ..core.errors import ClusterUnavailable
from .keys import Keys, pack_entry
from .redis_client import text

if TYPE_CHECKING:
    import redis
    from redis.typing import EncodableT, FieldT

RELEASE_WAIT = 3.0  # s a resume waits for the holder to hand its session over
REPLY_TTL_MS = 10_000  # a one-shot reply nobody read is gone after this

# Every write a holder makes to its session's keys is fenced: it goes through only while
# the record names this node with the epoch it took the session at (``take`` counts the
# epoch up), so a node that lost the session, however late it hears of it, writes nothing.
# FENCE leaves ``ok`` true for a record that is ours, nil for one that is gone (Redis lost
# it: the holder writes it back); ARGV[1] is the node, ARGV[2] its epoch.
FENCE = """
local held = redis.call('HMGET', KEYS[1], 'node', 'epoch')
local gone = redis.call('EXISTS', KEYS[1]) == 0
local ok = held[1] == ARGV[1] and held[2] == ARGV[2]
"""

# KEYS: session hash, replay list, inbox. ARGV: node, epoch.
DELETE_IF_HELD = FENCE + """
if gone or ok then return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) end
return 0
"""

# Write the session's record (fields and values from ARGV[4]) if it is ours, or gone.
# KEYS: session hash. ARGV: node, epoch, ttl ms, field, value, ...
WRITE_RECORD = FENCE + """
if not (gone or ok) then return 0 end
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'epoch', ARGV[2], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# Write the record and the whole replay window again (the holder's recovery), if ours or
# gone. KEYS: session hash, replay list. ARGV: node, epoch, ttl ms, number of record
# fields n, n field/value pairs, then the packed entries in order.
REWRITE = FENCE + """
if not (gone or ok) then return 0 end
local n = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'epoch', ARGV[2], unpack(ARGV, 5, 4 + 2 * n))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
local first = 5 + 2 * n
for j = first, #ARGV, 4000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, j, math.min(j + 3999, #ARGV)))
end
if #ARGV >= first then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
"""

# Keep a delivery or posted body in the session's inbox and tell its holder, as the
# record names it now (not as the poster read it: a take-over between the two emptied the
# inbox already, and only the new holder's beat would find the item). KEYS: inbox,
# session hash. ARGV: item, ttl ms, the queued-set key without its node, session id, the
# poster's node (told nothing: it takes its own inbox).
QUEUE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local holder = redis.call('HGET', KEYS[2], 'node')
if holder and holder ~= '' and holder ~= ARGV[5] then
  redis.call('SADD', ARGV[3] .. holder, ARGV[4])
  redis.call('PEXPIRE', ARGV[3] .. holder, ARGV[2])
end
return 1
"""

# Make this node the holder, at the next epoch (KEYS: session hash; ARGV: node); the new
# epoch, or 0 for a record that is gone.
TAKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'node', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'epoch', 1)
"""

# KEYS: a lock. ARGV: the value it must still have.
DELETE_IF_VALUE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Let a session go, unless another node took it meanwhile (a late release must not undo
# the new holder's record). KEYS: session hash, inbox. ARGV: node, epoch, user, ttl ms,
# state (empty: keep the stored one), calls_on (JSON call_id -> node running it; empty:
# none), then messages still waiting for credit, in order (they go before anything queued
# since).
LET_GO = FENCE + """
if not (gone or ok) then return 0 end
for i = #ARGV, 7, -1 do redis.call('LPUSH', KEYS[2], ARGV[i]) end
if #ARGV >= 7 then redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
redis.call('HSET', KEYS[1], 'user', ARGV[3], 'node', '', 'epoch', ARGV[2], 'connected', 0,
           'transport', '')
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'state', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'calls_on', ARGV[6])
else redis.call('HDEL', KEYS[1], 'calls_on') end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisStore:
    """One node's view of the cluster's Redis: ``ttl_ms`` is how long a session's keys
    outlive the last write (set once the session settings are known)."""

    def __init__(self, client: "redis.Redis", keys: Keys, node_id: str) -> None:
        self.redis = client
        self.keys = keys
        self.node_id = node_id
        self.ttl_ms = 0

    # -- session records -------------------------------------------------------------------

    def holder(self, session_id: str) -> tuple[str | None, str]:
        """The session's user (None: no such session) and the node holding it ("": none)."""
        user, node = self.redis.hmget(self.keys.session(session_id), "user", "node")
        return (text(user) if user is not None else None), (text(node) if node else "")

    def write_record(self, session_id: str, epoch: int,
                     record: dict["FieldT", "EncodableT"]) -> bool:
        """Write the session's record as its holder at ``epoch``; False (nothing written)
        if another node took it over since."""
        fields = [x for pair in record.items() for x in pair]
        return bool(self.redis.eval(WRITE_RECORD, 1, self.keys.session(session_id),
                                    self.node_id, epoch, self.ttl_ms, *fields))

    def record(self, session_id: str) -> dict[bytes, bytes]:
        return cast("dict[bytes, bytes]", self.redis.hgetall(self.keys.session(session_id)))

    def delete_if_held(self, session_id: str, epoch: int) -> None:
        """Delete the session's keys, unless another node holds it now (a node that lost
        it late must not delete it)."""
        self.redis.eval(DELETE_IF_HELD, 3, *self.keys.all_of(session_id), self.node_id,
                        epoch)

    def set_calls_on(self, session_id: str, remote: dict[str, str]) -> None:
        key = self.keys.session(session_id)
        if remote:
            self.redis.hset(key, "calls_on", orjson.dumps(remote))
        else:
            self.redis.hdel(key, "calls_on")

    def rewrite(self, session_id: str, epoch: int, record: dict["FieldT", "EncodableT"],
                entries: Iterable[tuple[int, int, bytes]]) -> bool:
        """Write the session's record and replace its replay window with (seq, stored_at,
        data) entries, as its holder at ``epoch``; False (nothing written) if another node
        took it over since."""
        packed = [pack_entry(seq, stored_at, data) for seq, stored_at, data in entries]
        fields = [x for pair in record.items() for x in pair]
        return bool(self.redis.eval(
            REWRITE, 2, self.keys.session(session_id), self.keys.replay(session_id),
            self.node_id, epoch, self.ttl_ms, len(record), *fields, *packed))

    # -- moving a session ------------------------------------------------------------------

    @contextlib.contextmanager
    def claim_lock(self, session_id: str) -> Iterator[None]:
        """One node at a time takes a session over: two resumes racing on two nodes are
        served one after the other (the later supersedes the earlier, as on one node)."""
        lock = self.keys.claim(session_id)
        deadline = time.monotonic() + RELEASE_WAIT + 2
        while not self.redis.set(lock, self.node_id, nx=True, px=int(RELEASE_WAIT * 3000)):
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"session {session_id!r} is being resumed elsewhere")
            gevent.sleep(0.02)
        try:
            yield
        finally:
            self.redis.eval(DELETE_IF_VALUE, 1, lock, self.node_id)

    def take(self, session_id: str) -> tuple[int, bytes | None, bytes | None, list[bytes],
                                             list[bytes]]:
        """Make this node the holder at the session's next epoch and read, in one
        transaction, that epoch, the session's state, calls_on, replay window and queued
        deliveries (which it empties)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.eval(TAKE, 1, self.keys.session(session_id), self.node_id)
        pipe.hget(self.keys.session(session_id), "state")
        pipe.hget(self.keys.session(session_id), "calls_on")
        pipe.lrange(self.keys.replay(session_id), 0, -1)
        pipe.lrange(self.keys.inbox(session_id), 0, -1)
        pipe.delete(self.keys.inbox(session_id))
        epoch, state, calls_on, replay, inbox, _ = pipe.execute()
        return int(epoch), state, calls_on, replay, inbox

    def let_go(self, session_id: str, epoch: int, user_id: str, state: bytes,
               calls_on: dict[str, str], waiting: Iterable[bytes]) -> bool:
        """Stop holding the session, leaving its state and ``waiting`` deliveries (first
        in its inbox) for the next holder; False if another node holds it already."""
        return bool(self.redis.eval(
            LET_GO, 2, self.keys.session(session_id), self.keys.inbox(session_id),
            self.node_id, epoch, user_id, self.ttl_ms, state,
            orjson.dumps(calls_on) if calls_on else b"", *waiting))

    # -- deliveries waiting in Redis ---------------------------------------------------------

    def queue(self, session_id: str, item: bytes) -> None:
        """Keep a delivery in the session's inbox, for its holder's next beat (the holder
        the record names when it is queued) or the next node to take the session over."""
        self.redis.eval(QUEUE, 2, self.keys.inbox(session_id), self.keys.session(session_id),
                        item, self.ttl_ms, self.keys.queued_for(""), session_id,
                        self.node_id)

    def take_inbox(self, session_id: str) -> list[bytes]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(self.keys.inbox(session_id), 0, -1)
        pipe.delete(self.keys.inbox(session_id))
        items, _ = pipe.execute()
        return cast("list[bytes]", items)

    # -- messages between nodes --------------------------------------------------------------

    def publish(self, channel: str, message: dict[str, Any]) -> int:
        """Post to a channel; the number of nodes that heard it."""
        return int(self.redis.publish(channel, orjson.dumps(message)))

    def wait_reply(self, reply: str, timeout: float) -> bytes | None:
        answer = self.redis.blpop([reply], timeout=timeout)
        return None if answer is None else cast(bytes, answer[1])

    def reply(self, reply: str, value: bytes) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(reply, value)
        pipe.pexpire(reply, REPLY_TTL_MS)
        pipe.execute()

    # -- Redis losing data ------------------------------------------------------------------

    def loss_at(self, now: int) -> int:
        """When a node last found that Redis lost data (ms; 0: never). The key itself
        missing means a loss just now (FLUSHALL, an empty restart): noted as ``now``."""
        value = self.redis.get(self.keys.loss)
        if value is not None:
            return int(value)
        self.redis.set(self.keys.loss, now, nx=True)
        return now

    def note_loss(self, now: int) -> None:
        self.redis.set(self.keys.loss, now)

    def note_no_loss(self) -> None:
        """A node starts: a cluster this new has lost nothing (kept if already known)."""
        self.redis.set(self.keys.loss, 0, nx=True)

    # -- nodes -----------------------------------------------------------------------------

    def node_alive(self, node_id: str) -> bool:
        return bool(self.redis.exists(self.keys.node(node_id)))

    def nodes_since(self, since_ms: int) -> list[str]:
        """The nodes that beat at or after ``since_ms``."""
        members = cast("list[bytes | str]", self.redis.zrangebyscore(
            self.keys.nodes, since_ms, "+inf"))  # members only, no scores
        return list(map(text, members))

    def node_reports(self, node_ids: list[str]) -> list[bytes | None]:
        return cast("list[bytes | None]",
                    self.redis.mget([self.keys.node(n) for n in node_ids]))

    def node_metrics(self, node_ids: list[str]) -> list[bytes | None]:
        return cast("list[bytes | None]",
                    self.redis.mget([self.keys.node_metrics(n) for n in node_ids]))

    def beat(self, now: int, report: bytes, metrics: bytes | None, node_ttl_ms: int,
             marker_ttl_ms: int, forget_after_ms: int, refresh: Iterable[str]
             ) -> tuple[bool, list[str]]:
        """Say this node is alive (with its figures and /metrics text), refresh the
        ``refresh`` sessions' expiry, and take the set of sessions with deliveries queued
        for this node. Returns whether the marker of the previous beat was still there
        (gone: Redis lost this node's data) and those sessions."""
        node = self.node_id
        pipe = self.redis.pipeline(transaction=False)
        marker = self.keys.node_marker(node)
        pipe.exists(marker)
        pipe.set(marker, 1, px=marker_ttl_ms)
        pipe.set(self.keys.node(node), report, px=node_ttl_ms)
        if metrics is not None:
            pipe.set(self.keys.node_metrics(node), metrics, px=node_ttl_ms)
        pipe.zadd(self.keys.nodes, {node: now})
        pipe.zremrangebyscore(self.keys.nodes, "-inf", now - forget_after_ms)
        for sid in refresh:  # (an inbox has its own expiry)
            pipe.pexpire(self.keys.session(sid), self.ttl_ms)
            pipe.pexpire(self.keys.replay(sid), self.ttl_ms)
        pipe.spop(self.keys.queued_for(node), 100_000)  # atomic take-all
        results = pipe.execute()
        return bool(results[0]), [s.decode() for s in results[-1] or ()]

    def leave(self) -> None:
        """This node stops: drop its figures and its place among the nodes."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.keys.node(self.node_id), self.keys.node_marker(self.node_id))
        pipe.zrem(self.keys.nodes, self.node_id)
        pipe.execute()
