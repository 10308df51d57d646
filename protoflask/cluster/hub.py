"""RedisHub: the session registry and delivery shared by every worker and node.

Each process (a "node": one gunicorn worker, or one server) holds its own sessions in
memory, exactly like LocalHub, and shares through Redis (see ``keys``):

- who holds each session, so a delivery, a posted body or a resume made anywhere finds
  it: deliveries and bodies go to the holder over its pub/sub channel; a resume moves the
  session here (the holder closes its transport with 4002 and writes what it had);
- each session's state and replay window (``journal``), so when its node dies any other
  node can take it over and replay every message the client may have missed;
- each node's statistics, refreshed every beat; a node that stops beating drops out of
  the counts and its sessions read as disconnected until they expire.

Redis being unreachable degrades, it does not stop: local sessions keep working from
memory, ``health()`` says "degraded", what only Redis can do raises ClusterUnavailable,
and once Redis answers again every local session is copied over again. The same holds
for any failure of the journal or of the background greenlets: logged once, "degraded",
retried with backoff, never raised into a transport.

Tool calls belong to the node that runs them. A session taken over from a node that is
gone (killed, stopped, cut off for longer than NODE_TTL_MS) ends each call that was
running there with one TOOL_DONE ERROR (TOOL_EXECUTION_ERROR, "node ... was lost"), which
frees its call_id; a call still running on a live node is watched every beat and ended
the same way if that node dies before it reports.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, cast

import gevent
import gevent.event
import orjson

from ..core import handoff, messages
from ..core.errors import (
    ERRORS_BY_CODE,
    ClusterUnavailable,
    ProtoError,
    SessionNotFound,
    ToolExecutionError,
)
from ..core.session import CLOSE_SUPERSEDED
from ..hub import OPERATIONS, Hub, LiveSession, SessionHost, broadcast_local, now_ms
from .journal import Journal, decode_state
from .keys import Keys, pack_entry, unpack_entry
from .nodes import aggregate_stats
from .redis_client import UNAVAILABLE, connect, text

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from redis.typing import EncodableT, FieldT


log = logging.getLogger("protoflask.cluster")

BEAT_MS = 1000  # how often a node says it is alive
NODE_TTL_MS = 3000  # a node that missed this long is gone (its sessions read disconnected)
MARKER_TTL_MS = 60_000  # a marker that outlives any beat: gone means Redis lost our data
RELEASE_WAIT = 3.0  # s a resume waits for the holder to hand its session over
DELIVERY_WAIT = 3.0  # s a delivery to another node waits for that node to confirm it
MAX_HOPS = 3  # re-routing of a delivery that raced a session's move
SUBSCRIBE_WAIT = 2.0  # s start() waits for this node's channel subscription


# KEYS: session hash, replay list, inbox. ARGV: this node's id.
DELETE_IF_HELD = """
local node = redis.call('HGET', KEYS[1], 'node')
if node == false or node == ARGV[1] then
  return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
return 0
"""


# KEYS: a lock. ARGV: the value it must still have.
DELETE_IF_VALUE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Let a session go, unless another node took it meanwhile (a late release must not undo
# the new holder's record). KEYS: session hash, inbox. ARGV: node, user, ttl ms, state
# (empty: keep the stored one), calls_on (JSON call_id -> node running it; empty: none),
# then messages still waiting for credit, in order (they go before anything queued since).
LET_GO = """
local holder = redis.call('HGET', KEYS[1], 'node')
if holder and holder ~= '' and holder ~= ARGV[1] then return 0 end
for i = #ARGV, 6, -1 do redis.call('LPUSH', KEYS[2], ARGV[i]) end
if #ARGV >= 6 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
redis.call('HSET', KEYS[1], 'user', ARGV[2], 'node', '', 'connected', 0, 'transport', '')
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'state', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'calls_on', ARGV[5])
else redis.call('HDEL', KEYS[1], 'calls_on') end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


def default_node_id() -> str:
    """Random: the public /stats and /health show node ids, never where nodes run (host
    and pid are in each node's figures, for an authenticated /stats)."""
    return uuid.uuid4().hex[:12]


class RedisHub(Hub):
    def __init__(self, url: str, prefix: str = "protoflask", *,
                 node_id: str | None = None) -> None:
        self.url = url
        self.redis = connect(url)
        self.keys = Keys(prefix)
        self.node_id = node_id or default_node_id()
        self.started_at = now_ms()
        self.degraded = False
        self._local: dict[str, LiveSession] = {}
        # sessions that moved to another node while tools of theirs still run here
        self._moved_away: dict[str, LiveSession] = {}
        # sessions held here with calls that run on another (live) node: sid -> {call_id:
        # node}; stored in the record's calls_on, watched every beat
        self._remote_calls: dict[str, dict[str, str]] = {}
        self._background_failing: str | None = None  # the beat's last unexpected failure
        self._handle_failing: str | None = None  # the listener's last message failure
        self._host: "SessionHost | None" = None
        self._journal: Journal | None = None
        self._greenlets: list[gevent.Greenlet] = []
        self._subscribed = gevent.event.Event()
        self._channel = self.keys.node_channel(self.node_id)
        #: the node's /metrics text, stored every beat for the others' /metrics to merge
        self.publish_metrics: Callable[[], bytes] | None = None
        #: sessions_elsewhere's recent answers: (user, limit) -> (monotonic time, answer)
        self._elsewhere_cache: dict[tuple[str | None, int], tuple[float, Any]] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def bind(self, host: SessionHost) -> None:
        self._host = host
        s = host.settings
        self.ttl_ms = s.replay_window_time + NODE_TTL_MS + BEAT_MS
        self._journal = Journal(self.redis, self.keys, self.node_id, s.replay_window_size,
                                self.ttl_ms, self._journal_failed, self._fenced)

    @property
    def host(self) -> SessionHost:
        assert self._host is not None, "RedisHub used before an engine bound it"
        return self._host

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "RedisHub used before an engine bound it"
        return self._journal

    def start(self) -> None:
        if self._greenlets:
            return
        self.journal.start()
        self._greenlets = [gevent.spawn(self._beat_forever), gevent.spawn(self._listen_forever)]
        # Serve once other nodes can reach this one (else their first deliveries would
        # wait in Redis for the next beat).
        self._subscribed.wait(SUBSCRIBE_WAIT)

    def stop(self) -> None:
        gevent.killall(self._greenlets, block=True, timeout=2)
        self._greenlets = []
        if self._journal is not None:
            self._journal.stop()
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(self.keys.node(self.node_id), self.keys.node_marker(self.node_id))
            pipe.zrem(self.keys.nodes, self.node_id)
            pipe.execute()
        except UNAVAILABLE:
            pass
        self.redis.connection_pool.disconnect()

    # -- registry ----------------------------------------------------------------------

    def add(self, live: LiveSession) -> None:
        self._hold(live)
        self._write_record(live)

    def get(self, session_id: str) -> LiveSession | None:
        return self._local.get(session_id)

    def remove(self, session_id: str) -> LiveSession | None:
        live = self._local.pop(session_id, None)
        if live is not None:
            live.journal = None
            self._remote_calls.pop(session_id, None)
            self.journal.forget(session_id)
            try:  # only if it is still ours (a node that lost it late must not delete it)
                self.redis.eval(DELETE_IF_HELD, 3, *self.keys.all_of(session_id),
                                self.node_id)
            except UNAVAILABLE as exc:
                self._went_down(exc)
        return live

    def sessions(self) -> list[LiveSession]:
        return list(self._local.values())

    def __len__(self) -> int:
        return len(self._local)

    def changed(self, live: LiveSession) -> None:
        if live.id in self._local:
            self._write_record(live)

    def _hold(self, live: LiveSession) -> None:
        self._local[live.id] = live
        live.journal = self.journal.append
        live.journaled_seq = max(live.journaled_seq, live.core.downstream_seq)

    def _write_record(self, live: LiveSession) -> None:
        transport = live.transport
        record: dict["FieldT", "EncodableT"] = {
            "user": live.user_id, "node": self.node_id, "connected": int(live.core.connected),
            "transport": transport.kind if transport is not None else ""}
        state = self._state(live)
        if state:
            record["state"] = state
        try:
            pipe = self.redis.pipeline(transaction=False)
            key = self.keys.session(live.id)
            pipe.hset(key, mapping=record)
            pipe.pexpire(key, self.ttl_ms)
            pipe.execute()
        except UNAVAILABLE as exc:
            self._went_down(exc)

    def _state(self, live: LiveSession) -> bytes:
        """The session's state as stored in Redis; empty when it cannot be encoded."""
        return self.journal.state_of(live)

    def state_changed(self, live: LiveSession) -> None:
        if live.id in self._local:
            self.journal.note_state(live)

    # -- delivery ----------------------------------------------------------------------

    def deliver(self, session_id: str, op: str, *args: Any) -> bool:
        live = self._local.get(session_id)
        if live is not None:
            return live.apply(op, args)
        return self._deliver_remote(session_id, op, args)

    def _deliver_remote(self, session_id: str, op: str, args: tuple[Any, ...],
                        hops: int = 0) -> bool:
        item = {"name": op, "args": encode_args(op, args)}
        try:
            user, raw_node = self.redis.hmget(self.keys.session(session_id), "user", "node")
            if user is None:
                raise SessionNotFound(f"no session {session_id!r}")
            node = text(raw_node) if raw_node else ""
            if node and node != self.node_id and hops < MAX_HOPS:
                # Wait for the holder to queue it, so that what the application sends next,
                # from any node, comes after it.
                reply = self.keys.reply(uuid.uuid4().hex)
                sent = self.redis.publish(self.keys.node_channel(node), orjson.dumps(
                    {"op": "deliver", "sid": session_id, "hops": hops, "reply": reply,
                     **item}))
                if sent:
                    answer = self.redis.blpop([reply], timeout=DELIVERY_WAIT)
                    if answer is None:
                        log.warning("node %s did not confirm %s for session %s within %.0fs",
                                    node, op, session_id, DELIVERY_WAIT)
                        return True
                    return answer[1] == b"1"
            # No node heard it: the next one to take the session over sends this first, or
            # the holder, if alive but not listening just now, at its next beat.
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(self.keys.inbox(session_id), orjson.dumps(item))
            pipe.pexpire(self.keys.inbox(session_id), self.ttl_ms)
            if node and node != self.node_id:
                pipe.sadd(self.keys.queued_for(node), session_id)
                pipe.pexpire(self.keys.queued_for(node), self.ttl_ms)
            pipe.execute()
            return True
        except UNAVAILABLE as exc:
            self._went_down(exc)
            raise ClusterUnavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    def broadcast(self, out: messages.Outbound) -> int:
        reached = broadcast_local(self.sessions(), out)
        try:
            self.redis.publish(self.keys.broadcast, orjson.dumps(
                {"op": "broadcast", "from": self.node_id, "out": out.to_dict()}))
        except UNAVAILABLE as exc:
            self._went_down(exc)
            raise ClusterUnavailable(
                f"broadcast reached {reached} sessions on this node; Redis is unreachable, "
                "so other nodes' sessions were not reached") from exc
        return reached

    def forward_upstream(self, session_id: str, user_id: str, body: bytes) -> bool:
        try:
            user, node = self.redis.hmget(self.keys.session(session_id), "user", "node")
            if user is None or text(user) != user_id:
                raise SessionNotFound(f"no session {session_id!r} for this user")
            if not node or text(node) == self.node_id:
                return False
            return bool(self.redis.publish(self.keys.node_channel(text(node)), orjson.dumps(
                {"op": "upstream", "sid": session_id, "user": user_id,
                 "body": base64.b64encode(body).decode()})))
        except UNAVAILABLE as exc:
            self._went_down(exc)
            raise ClusterUnavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    # -- moving sessions between nodes -------------------------------------------------

    def claim(self, session_id: str, user_id: str) -> LiveSession | None:
        """Take over a session held elsewhere (asking its holder to let go) or by no one."""
        key = self.keys.session(session_id)
        try:
            user = self.redis.hget(key, "user")
            if user is None or text(user) != user_id:
                return None
            with self._claim_lock(session_id):
                return self._take_over(session_id, key)
        except UNAVAILABLE as exc:
            self._went_down(exc)
            raise ClusterUnavailable("cannot resume a session held elsewhere: Redis is "
                                     "unreachable") from exc

    @contextlib.contextmanager
    def _claim_lock(self, session_id: str) -> Iterator[None]:
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

    def _take_over(self, session_id: str, key: str) -> LiveSession | None:
        """Under the claim lock: ask a live holder to let go, then take the session's
        record, state, window and queued deliveries in one transaction."""
        node = self.redis.hget(key, "node")
        holder = text(node) if node else ""
        if holder and holder != self.node_id and self._node_alive(holder):
            self._ask_release(holder, session_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, "node", self.node_id)
        pipe.hget(key, "state")
        pipe.hget(key, "calls_on")
        pipe.lrange(self.keys.replay(session_id), 0, -1)
        pipe.lrange(self.keys.inbox(session_id), 0, -1)
        pipe.delete(self.keys.inbox(session_id))
        _, state, calls_on, replay, inbox, _ = pipe.execute()
        if state is None:
            return None
        now = now_ms()
        core = handoff.restore(decode_state(state), self.host.settings, now,
                               (unpack_entry(item) for item in replay))
        if core.disconnected_at is not None:
            core.disconnected_at = now  # kept replayWindowTime from its move, as any detach
        live = self.host.adopt(core)
        self._hold(live)
        self._apply_queued(live, inbox)
        self._adopt_calls(live, holder, decode_state(calls_on) if calls_on else {})
        log.info("session %s taken over from %s", session_id, holder or "no node")
        return live

    # -- tool calls whose node may be gone ---------------------------------------------

    def _adopt_calls(self, live: LiveSession, holder: str, runs_on: dict[str, str]) -> None:
        """A session just taken over: each of its open calls runs on the node that
        ``runs_on`` names, else on its last holder. Calls of a node that is gone end now;
        those of a live node are watched (``_watch_calls``) until they report."""
        watched: dict[str, str] = {}
        orphans: dict[str, str] = {}
        alive: dict[str, bool] = {}
        moved = self._moved_away.get(live.id)
        for call_id in list(live.core.calls):
            node = runs_on.get(call_id) or holder
            if node == self.node_id:
                if moved is not None and moved.runner is not None \
                        and call_id in moved.runner.executions:
                    continue  # back where it runs: it reports here (_forward_moved)
                orphans[call_id] = node  # this node ran it before a restart of its own
            elif node and alive.setdefault(node, self._node_alive(node)):
                watched[call_id] = node
            else:
                orphans[call_id] = node
        self._remote_calls.pop(live.id, None)
        if watched:
            self._remote_calls[live.id] = watched
        if watched or runs_on:
            self._store_calls_on(live.id, watched)
        for call_id, node in orphans.items():
            self._end_orphan(live, call_id, node)

    def _end_orphan(self, live: LiveSession, call_id: str, node: str) -> None:
        """The call's node is gone: its one TOOL_DONE (ERROR), which frees its call_id."""
        log.warning("session %s: tool call %s was running on node %s, which was lost; "
                    "ending it", live.id, call_id, node or "(unknown)")
        live.fail_call(call_id, ToolExecutionError(
            f"tool call {call_id!r} was running on node {node or '(unknown)'}, which was "
            "lost; it will not finish"))
        self.cancel_elsewhere(live.id, call_id)  # should that node be alive after all

    def _store_calls_on(self, session_id: str, remote: dict[str, str]) -> None:
        """Record which calls run on other nodes, for whoever takes the session over
        next (calls not named there run on the holder)."""
        key = self.keys.session(session_id)
        if remote:
            self.redis.hset(key, "calls_on", orjson.dumps(remote))
        else:
            self.redis.hdel(key, "calls_on")

    def _settle_calls(self, session_id: str) -> None:
        """Forget watched calls that have ended."""
        watched = self._remote_calls.get(session_id)
        if watched is None:
            return
        live = self._local.get(session_id)
        if live is None:
            del self._remote_calls[session_id]
            return
        ended = [cid for cid in watched if cid not in live.core.calls]
        for cid in ended:
            del watched[cid]
        if not watched:
            del self._remote_calls[session_id]
        if ended:
            self._store_calls_on(session_id, watched)

    def _watch_calls(self) -> None:
        """Every beat: end the watched calls whose node died before they reported."""
        alive: dict[str, bool] = {}
        for sid in list(self._remote_calls):
            self._settle_calls(sid)
            watched = self._remote_calls.get(sid)
            live = self._local.get(sid)
            if not watched or live is None:
                continue
            dead = {cid: node for cid, node in watched.items()
                    if not alive.setdefault(node, self._node_alive(node))}
            if dead:
                for cid, node in dead.items():
                    self._end_orphan(live, cid, node)
                self._settle_calls(sid)

    def _ask_release(self, holder: str, session_id: str) -> None:
        token = uuid.uuid4().hex
        reply = self.keys.reply(token)
        asked = self.redis.publish(self.keys.node_channel(holder), orjson.dumps(
            {"op": "release", "sid": session_id, "reply": reply}))
        if asked and self.redis.blpop([reply], timeout=RELEASE_WAIT) is None:
            log.warning("node %s did not hand session %s over within %.0fs; taking it",
                        holder, session_id, RELEASE_WAIT)

    def _release(self, session_id: str, reply: str) -> None:
        """Another node resumes this session: close our transport (4002), write what we
        hold, and let it go. Tool calls still running here report there."""
        live = self._local.get(session_id)
        if live is not None:
            self.host.close_transport(live, CLOSE_SUPERSEDED, "resumed on another node")
            self._let_go(live)
            live.moved = self._forward_moved
            if live.runner is not None and live.runner.executions:
                self._moved_away[session_id] = live
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(reply, b"released")
            pipe.pexpire(reply, 10_000)
            pipe.execute()
        except UNAVAILABLE as exc:
            self._went_down(exc)

    def _let_go(self, live: LiveSession) -> None:
        """Write a session's whole state, and messages still waiting for credit, and stop
        holding it (its Redis record stays for whoever resumes it)."""
        live.take_writable(now_ms())
        self.journal.flush()
        waiting = handoff.pending_outbound(live.core)
        live.core.pending.clear()
        self._local.pop(live.id, None)
        live.journal = None
        remote = self._remote_calls.pop(live.id, {})
        # every open call runs here unless it was watched running elsewhere
        calls_on = {cid: remote.get(cid, self.node_id) for cid in live.core.calls}
        try:
            written = self.redis.eval(
                LET_GO, 2, self.keys.session(live.id), self.keys.inbox(live.id), self.node_id,
                live.user_id, self.ttl_ms, self._state(live),
                orjson.dumps(calls_on) if calls_on else b"",
                *(orjson.dumps({"name": "send", "args": [ob]}) for ob in waiting))
            if not written:
                log.warning("session %s was taken over by another node before this one let "
                            "it go; its state here is dropped", live.id)
        except UNAVAILABLE as exc:
            self._went_down(exc)

    def _fenced(self, taken: list[str], missing: list[str]) -> None:
        self._lost(taken)
        if missing:
            self._data_lost(f"the records of {len(missing)} sessions are gone")

    def _data_lost(self, what: str) -> None:
        """Redis answers but lost what this node wrote (restarted without persistence):
        handled like an outage, so the next beat copies every session over again."""
        if not self.degraded:
            log.error("Redis at %s lost this node's data (%s; restarted?); copying every "
                      "session over again", self.url, what)
        self.degraded = True
        if self._journal is not None:
            self._journal.paused = True

    def _lost(self, session_ids: list[str]) -> None:
        """Another node took these sessions over while this one still held them (it was
        slow to answer, or cut off from Redis): stop serving them here, write nothing."""
        for sid in session_ids:
            live = self._local.pop(sid, None)
            if live is None:
                continue
            log.warning("session %s is held by another node now; dropping it here", sid)
            live.journal = None
            live.moved = self._forward_moved
            self.host.close_transport(live, CLOSE_SUPERSEDED, "resumed on another node")

    def hand_off(self, live: LiveSession) -> None:
        """This node is stopping: leave the session to the cluster for a resume elsewhere."""
        if live.id in self._local:
            self._let_go(live)

    def cancel_elsewhere(self, session_id: str, call_id: str) -> None:
        try:
            self.redis.publish(self.keys.broadcast, orjson.dumps(
                {"op": "cancel", "from": self.node_id, "sid": session_id, "call": call_id}))
        except UNAVAILABLE as exc:
            self._went_down(exc)  # the client has its TOOL_DONE CANCELLED already

    def _on_cancel(self, data: dict[str, Any]) -> None:
        live = self._moved_away.get(data["sid"])
        if live is not None and live.runner is not None:
            live.runner.cancel(data["call"])  # its TOOL_DONE is a no-op at the new node

    def _forget_finished_moves(self) -> None:
        for sid, live in list(self._moved_away.items()):
            if live.runner is None or not live.runner.executions:
                del self._moved_away[sid]

    def _forward_moved(self, session_id: str, op: str, args: tuple[Any, ...]) -> bool:
        back = self._local.get(session_id)
        if back is not None:  # the session came back here while the call ran
            return back.apply(op, args)
        try:
            return self._deliver_remote(session_id, op, args)
        except ProtoError as exc:
            log.warning("session %s moved away and %s for it was lost: %s", session_id, op, exc)
            return False

    def _apply_queued(self, live: LiveSession, items: Iterable[bytes]) -> None:
        for raw in items:
            item = orjson.loads(raw)
            OPERATIONS[item["name"]](live, *decode_args(item["name"], item["args"]))

    # -- reading the cluster -----------------------------------------------------------

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        try:
            record = self.redis.hgetall(self.keys.session(session_id))
            if not record:
                return None
            node = text(record.get(b"node", b""))
            alive = bool(node) and self._node_alive(node)
        except UNAVAILABLE as exc:
            self._went_down(exc)
            raise ClusterUnavailable("Redis is unreachable") from exc
        state = decode_state(record[b"state"])
        return {
            "id": session_id,
            "userId": state["user"],
            "connected": alive and record.get(b"connected") == b"1",
            "handshakeCompleted": state["handshake"],
            "lastActivity": state["last_activity"],
            "lastAck": str(state["last_ack"]),
            "lastDeliveredSeq": str(state["downstream_seq"]),
            "lastClientSeq": str(state["upstream_seq"]),
            "activeRuns": {run[0] for run in state["runs"]},
            "node": node if alive else None,
        }

    #: Session records a dashboard poll reads at most (SCAN of {p}:s:*): its cost stays
    #: bounded however many sessions the cluster holds (about 0.2 s at 10,000; see
    #: bench/dashboard_cluster.py); beyond it the list is partial. Answers are reused for
    #: ELSEWHERE_CACHE_S, so any number of open dashboards costs one scan per second.
    SCAN_LIMIT = 10_000
    ELSEWHERE_CACHE_S = 1.0

    def sessions_elsewhere(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                         bool]:
        cache = self._elsewhere_cache
        now = time.monotonic()
        hit = cache.get((user_id, limit))
        if hit is not None and now - hit[0] < self.ELSEWHERE_CACHE_S:
            return hit[1]
        answer = self._scan_sessions(user_id, limit)
        if len(cache) > 256:
            cache.clear()
        cache[(user_id, limit)] = (now, answer)
        return answer

    def _scan_sessions(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                       bool]:
        rows: list[dict[str, Any]] = []
        complete = True
        try:
            keys: list[bytes] = []
            for key in self.redis.scan_iter(match=self.keys.session("*"), count=500):
                if len(keys) >= self.SCAN_LIMIT:
                    complete = False
                    break
                keys.append(key)
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "user", "node")
            owners = pipe.execute() if keys else []
            wanted = [key for key, (user, node) in zip(keys, owners, strict=True)
                      if user is not None and (user_id is None or user.decode() == user_id)
                      and (node or b"").decode() != self.node_id]
            pipe = self.redis.pipeline(transaction=False)
            for key in wanted:
                pipe.hmget(key, "node", "connected", "transport", "state")
            records = pipe.execute() if wanted else []
            alive = {n.decode() for n in self.redis.zrangebyscore(
                self.keys.nodes, now_ms() - NODE_TTL_MS, "+inf")}
        except UNAVAILABLE as exc:
            self._went_down(exc)
            return [], False
        prefix = len(self.keys.session(""))
        for key, (node, connected, transport, state) in zip(wanted, records, strict=True):
            if state is None:
                continue  # expired between the two reads
            session_id = key.decode()[prefix:]
            if session_id in self._local:
                continue
            data = orjson.loads(state)
            holder = (node or b"").decode()
            live = holder in alive
            rows.append({
                "id": session_id, "userId": data["user"],
                "transport": (transport or b"").decode() or None if live else None,
                "connected": live and connected == b"1",
                "handshakeCompleted": data["handshake"],
                "lastActivity": data["last_activity"],
                "lastClientSeq": data["upstream_seq"],
                "lastDeliveredSeq": data["downstream_seq"],
                "activeRuns": len(data["runs"]),
                "node": holder if live else None,
            })
        rows.sort(key=lambda r: r["lastActivity"], reverse=True)
        return rows[:limit], complete

    def _node_alive(self, node_id: str) -> bool:
        return bool(self.redis.exists(self.keys.node(node_id)))

    def cluster_stats(self, local: dict[str, Any]) -> dict[str, Any]:
        own = {**local, **self._node_meta()}
        others: list[dict[str, Any]] = []
        try:
            ids = self._other_live_nodes()
            if ids:
                others = [orjson.loads(raw) for raw in
                          self.redis.mget([self.keys.node(n) for n in ids]) if raw]
        except UNAVAILABLE as exc:
            self._went_down(exc)
        return {**aggregate_stats([own, *others]), "node": self.node_id,
                "cluster": self.health()}

    def metrics_registry(self, local: "CollectorRegistry") -> "CollectorRegistry":
        from prometheus_client import generate_latest

        from .metrics import cluster_registry

        return cluster_registry({self.node_id: generate_latest(local).decode(),
                                 **self.node_metrics()})

    def node_metrics(self) -> dict[str, str]:
        """The other live nodes' stored /metrics texts, by node id."""
        try:
            ids = self._other_live_nodes()
            texts = self.redis.mget([self.keys.node_metrics(n) for n in ids]) if ids else []
        except UNAVAILABLE as exc:
            self._went_down(exc)
            return {}
        return {n: text(t) for n, t in zip(ids, texts, strict=True) if t}

    def _other_live_nodes(self) -> list[str]:
        """The ids of the other nodes that beat within NODE_TTL_MS."""
        members = cast("list[bytes | str]", self.redis.zrangebyscore(
            self.keys.nodes, now_ms() - NODE_TTL_MS, "+inf"))  # members only, no scores
        return [node for node in map(text, members) if node != self.node_id]

    def health(self) -> str:
        """"degraded" while this node cannot write to Redis: unreachable, lost our data
        and not yet copied over again, the journal failing, a background failure."""
        journal_ok = self._journal is None or self._journal.alive
        return "ok" if not self.degraded and journal_ok and self._background_failing is None \
            else "degraded"

    def _node_meta(self) -> dict[str, Any]:
        sessions = self.sessions()
        return {"node": self.node_id, "host": socket.gethostname(), "pid": os.getpid(),
                "sessions": len(sessions),
                "connectedSessions": sum(1 for s in sessions if s.core.connected),
                "errorsSent": self.host.local_stats()["errorsSent"]}

    # -- background: beat, listen, recover ---------------------------------------------

    def _beat_forever(self) -> None:
        beats = 0
        failures = 0
        refreshed_at = 0
        while True:
            try:
                now = now_ms()
                local = self.host.local_stats()
                del local["errorsSent"]  # the node's part, last (as the others read it)
                report = {**local, **self._node_meta()}
                pipe = self.redis.pipeline(transaction=False)
                # The marker set by the previous beat still there says Redis kept our data.
                marker = self.keys.node_marker(self.node_id)
                pipe.exists(marker)
                pipe.set(marker, 1, px=MARKER_TTL_MS)
                pipe.set(self.keys.node(self.node_id), orjson.dumps(report), px=NODE_TTL_MS)
                if self.publish_metrics is not None:
                    pipe.set(self.keys.node_metrics(self.node_id), self.publish_metrics(),
                             px=NODE_TTL_MS)
                pipe.zadd(self.keys.nodes, {self.node_id: now})
                pipe.zremrangebyscore(self.keys.nodes, "-inf", now - 10 * NODE_TTL_MS)
                if now - refreshed_at >= self.ttl_ms // 3:
                    for sid in list(self._local):  # (an inbox has its own expiry)
                        pipe.pexpire(self.keys.session(sid), self.ttl_ms)
                        pipe.pexpire(self.keys.replay(sid), self.ttl_ms)
                    refreshed_at = now
                self._forget_finished_moves()
                if self._remote_calls:
                    self._watch_calls()
                pipe.spop(self.keys.queued_for(self.node_id), 100_000)  # atomic take-all
                results = pipe.execute()
                kept, waiting = results[0], results[-1]
                if waiting:  # deliveries that found this node alive but not listening
                    self._drain_inboxes([s.decode() for s in waiting])
                if not kept and beats and not self.degraded:
                    self._data_lost("this node's marker key is gone")
                beats += 1
                if self.degraded:
                    self._recover()
                failures = 0
                if self._background_failing is not None:
                    log.warning("cluster beat works again")
                    self._background_failing = None
                gevent.sleep(BEAT_MS / 1000.0)
            except UNAVAILABLE as exc:
                self._went_down(exc)
                failures += 1
                gevent.sleep(backoff(failures))
            except Exception as exc:  # noqa: BLE001 - the beat must outlive any bug or reply
                self._background_failed("beat", exc)
                failures += 1
                gevent.sleep(backoff(failures))

    def _listen_forever(self) -> None:
        failures = 0
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self._channel, self.keys.broadcast)
                self._subscribed.set()
                if failures:
                    self._drain_inboxes()  # deliveries made while we could not hear them
                failures = 0
                for message in pubsub.listen():
                    self._handle(message)
            except UNAVAILABLE as exc:
                self._went_down(exc)
                failures += 1
                gevent.sleep(backoff(failures))
            except Exception as exc:  # noqa: BLE001 - keep listening whatever happened
                self._background_failed("listener", exc)
                failures += 1
                gevent.sleep(backoff(failures))
            finally:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - a dead connection may not close cleanly
                    pass

    def _handle(self, message: dict[str, Any]) -> None:
        try:
            data = orjson.loads(message["data"])
            op = data["op"]
            if op == "deliver":
                self._on_deliver(data)
            elif op == "broadcast":
                if data["from"] != self.node_id:
                    broadcast_local(self.sessions(), messages.from_dict(data["out"]))
            elif op == "upstream":
                self._on_upstream(data)
            elif op == "release":
                self._release(data["sid"], data["reply"])
            elif op == "cancel":
                if data["from"] != self.node_id:
                    self._on_cancel(data)
        except UNAVAILABLE:
            raise
        except Exception as exc:  # one bad message must not stop this node hearing the others
            # the first of a series with its traceback (a Redis refusing writes fails
            # every confirmation the same way: one line, not one per message)
            kind = f"{type(exc).__name__}: {exc}"
            if kind != self._handle_failing:
                log.exception("cluster message could not be handled")
                self._handle_failing = kind
        else:
            self._handle_failing = None

    def _on_deliver(self, data: dict[str, Any]) -> None:
        sid, name = data["sid"], data["name"]
        args = decode_args(name, data["args"])
        live = self._local.get(sid)
        if live is not None:
            result = live.apply(name, args)
            if name in ("tool_done", "fail_call") and sid in self._remote_calls:
                self._settle_calls(sid)
        else:  # it moved on since the sender looked
            result = self._deliver_remote(sid, name, args, data["hops"] + 1)
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(data["reply"], b"1" if result else b"0")
        pipe.pexpire(data["reply"], 10_000)
        pipe.execute()

    def _on_upstream(self, data: dict[str, Any]) -> None:
        live = self._local.get(data["sid"])
        if live is None or live.user_id != data["user"]:
            log.warning("a body posted for session %s arrived after it moved; dropped",
                        data["sid"])
            return
        try:
            self.host.receive_body(live, base64.b64decode(data["body"]))
        except ProtoError:
            pass  # already reported downstream; the posting node answered the HTTP 400

    def _journal_failed(self, exc: BaseException, session_ids: set[str]) -> None:
        """A journal write failed (it logged why): degraded until the next beat copies
        every window over again, whatever the failure was."""
        if isinstance(exc, UNAVAILABLE):
            self._went_down(exc)
            return
        self.degraded = True
        self.journal.paused = True

    def _went_down(self, exc: BaseException) -> None:
        if not self.degraded:
            log.error("Redis at %s is unreachable (%s): degraded; local sessions keep "
                      "working, retrying with backoff", self.url, exc)
        self.degraded = True
        if self._journal is not None:
            self._journal.paused = True

    def _background_failed(self, what: str, exc: Exception) -> None:
        """An unexpected failure in the beat or the listener: logged once per series,
        reported by /health, retried with backoff."""
        if self._background_failing is None:
            log.error("cluster %s failed; retrying with backoff", what, exc_info=exc)
        self._background_failing = f"{what}: {type(exc).__name__}: {exc}"
        self.degraded = True
        if self._journal is not None:
            self._journal.paused = True

    def _recover(self) -> None:
        """Redis takes writes again: journal from now on, copy every local session over
        again (a message stamped meanwhile is in the copy, or appended after it; the
        journal skips what the copy already holds), then deliver what was queued for
        them meanwhile. Anything failing on the way leaves the node degraded, and the
        next beat starts again."""
        self.journal.paused = False
        for live in self.sessions():
            self._rewrite(live)
        self._drain_inboxes()
        if self.journal.paused:  # a write failed meanwhile (it said why)
            return
        self.journal.resumed()
        self.degraded = False
        log.warning("Redis at %s takes writes again; %d sessions copied over", self.url,
                    len(self._local))

    def _rewrite(self, live: LiveSession) -> None:
        sid = live.id
        holder = self.redis.hget(self.keys.session(sid), "node")
        if holder and text(holder) not in ("", self.node_id):
            self._lost([sid])  # taken over while this node could not reach Redis
            return
        entries = [pack_entry(e.seq, e.stored_at, e.data) for e in live.core.replay]
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.replay(sid))
        if entries:
            pipe.rpush(self.keys.replay(sid), *entries)
            pipe.pexpire(self.keys.replay(sid), self.ttl_ms)
        pipe.execute()
        live.journaled_seq = live.core.downstream_seq
        self._write_record(live)

    def _drain_inboxes(self, session_ids: list[str] | None = None) -> None:
        held = self.sessions() if session_ids is None else \
            [live for sid in session_ids if (live := self._local.get(sid)) is not None]
        for live in held:
            pipe = self.redis.pipeline(transaction=True)
            pipe.lrange(self.keys.inbox(live.id), 0, -1)
            pipe.delete(self.keys.inbox(live.id))
            items, _ = pipe.execute()
            if items:
                self._apply_queued(live, items)


def backoff(failures: int) -> float:
    """Seconds before the next attempt: 0.1, 0.2, 0.4 ... up to 5."""
    return min(5.0, 0.1 * 2.0 ** min(failures - 1, 6))


# -- delivery operations on the wire ---------------------------------------------------------


def encode_args(op: str, args: tuple[Any, ...]) -> list[Any]:
    if op == "send":
        return [args[0].to_dict()]
    if op == "tool_update":
        return list(args)
    if op == "tool_done":
        call_id, status, result, error = args
        return [call_id, status, result, error.to_payload() if error is not None else None]
    if op == "fail_call":
        return [args[0], args[1].to_payload()]
    raise ValueError(f"unknown delivery operation {op!r}")


def decode_args(op: str, args: list[Any]) -> tuple[Any, ...]:
    if op == "send":
        return (messages.from_dict(args[0]),)
    if op == "tool_update":
        return tuple(args)
    if op == "tool_done":
        call_id, status, result, error = args
        return call_id, status, result, _error(error)
    if op == "fail_call":
        return args[0], _error(args[1])
    raise ValueError(f"unknown delivery operation {op!r}")


def _error(payload: dict[str, Any] | None) -> ProtoError | None:
    if payload is None:
        return None
    cls = ERRORS_BY_CODE.get(payload["code"], ProtoError)
    exc = cls(payload.get("message"), detail=payload.get("detail"),
              related_id=payload.get("related_id"))
    if cls is ProtoError:
        exc.code = payload["code"]
    return exc
