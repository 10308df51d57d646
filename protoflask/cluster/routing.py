"""A hub shared by the nodes of a cluster: routing on top of the local registry.

Each node (a gunicorn worker, or a server) holds its sessions in memory like the LocalHub
this extends, and adds routing through Redis (operations: ``store``; keys: ``keys``):

- who holds each session, so a delivery, a posted body or a resume made anywhere finds
  it: deliveries and bodies go to the holder over its pub/sub channel (confirmed once
  Redis has them; a delivery left unconfirmed waits in the session's inbox, skipped by
  its id where it arrived already); a resume moves the session here (the holder lets go
  first);
- each session's state and replay window (``journal``), so any node can take it over.

Redis unreachable degrades, it does not stop: local sessions keep working from memory,
``health()`` says "degraded", what only Redis can do raises ClusterUnavailable; entered
here (``degrade``), left by the beat's recovery (``hub``). Calls: ``calls``.
"""

from __future__ import annotations

import base64
import itertools
import logging
import uuid
from typing import TYPE_CHECKING, Any, Iterable

import gevent
import orjson

from ..bell import apart
from ..core import handoff, messages
from ..clock import now_ms
from ..core.errors import ClusterUnavailable, CloseCode, ProtoError, SessionNotFound
from ..config import ServerConfig
from ..hub import LocalHub, Upstream
from ..live import LiveSession, Operation, Send, decode_operation, encode_operation
from .calls import RemoteCalls
from .follow import Follow, first_copy
from .settling import BEAT_MS, NODE_TTL_MS, SETTLE_MS, settled, unavailable
from .journal import Journal, decode_state
from .letgo import LetGo
from .keys import Keys, unpack_entry
from .redis_client import UNAVAILABLE, connect, display_url
from .store import RELEASE_WAIT, RedisStore

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

log = logging.getLogger("protoflask.cluster")

DELIVERY_WAIT = 3.0  # s a delivery to another node waits for that node to confirm it
MAX_HOPS = 3  # re-routing of a delivery that raced a session's move
MOVED_REASON = "the session moved to another node; resume it"  # (its 4004's)


def default_node_id() -> str:
    """Random: the public /stats and /health show node ids, never where nodes run (host
    and pid are in each node's figures, for an authenticated /stats)."""
    return uuid.uuid4().hex[:12]


class RoutingHub(LocalHub):
    """Sessions held here, found from anywhere (the beat, the listener: ``RedisHub``)."""

    clustered = True

    def __init__(self, url: str, prefix: str = "protoflask", *,
                 node_id: str | None = None, config: ServerConfig | None = None) -> None:
        super().__init__()
        config = config if config is not None else ServerConfig()
        self.url = display_url(url)  # for log lines and /health: never its password
        self.redis = connect(url)
        self.keys = Keys(prefix)
        self.node_id = node_id or default_node_id()
        self.store = RedisStore(self.redis, self.keys, self.node_id)
        self.calls = RemoteCalls(self.store, self.get, self.cancel_elsewhere)
        self._deliveries = itertools.count(1)  # this node's delivery ids (see deliver_remote)
        self.degraded = False
        #: since when Redis has answered this node without a break (ms; None: it does not).
        #: A node just started has had no break to recover from (a loss of Redis's data
        #: is still waited out through the loss key): it answers unknown sessions at once,
        #: so an AG-UI thread or MCP session created on a fresh node is not refused 503.
        self.reachable_since: int | None = now_ms() - SETTLE_MS
        self.background_failing: str | None = None  # the beat's last unexpected failure
        # a session's keys outlive its replay window by a node's silence
        self.store.ttl_ms = config.replay_window_time + NODE_TTL_MS + BEAT_MS
        self.journal = Journal(self.redis, self.keys, self.node_id, config.replay_window_size,
                               self.ttl_ms, self.journal_failed, self._fenced)
        self.let_go = LetGo(self)  # a session to its next holder (a resume elsewhere, a drain)

    @property
    def ttl_ms(self) -> int:
        return self.store.ttl_ms

    # -- degraded mode -------------------------------------------------------------------

    def degrade(self, first: str | None = None) -> None:
        """Enter degraded mode (the journal pauses); ``first`` is logged unless it was
        degraded already."""
        if first is not None and not self.degraded:
            log.error("%s", first)
        self.degraded = True
        self.reachable_since = None
        self.journal.paused = True

    def went_down(self, exc: BaseException) -> None:
        self.degrade(f"Redis at {self.url} is unreachable ({exc}): degraded; local "
                     "sessions keep working, retrying with backoff")

    def data_lost(self, what: str) -> None:
        """Redis answers but lost what this node wrote (restarted without persistence):
        handled like an outage, so the next beat copies every session over again."""
        self.degrade(f"Redis at {self.url} lost this node's data ({what}; restarted?); "
                     "copying every session over again")

    def journal_failed(self, exc: BaseException) -> None:
        """A journal write failed (it logged why): degraded until the next beat copies
        every window over again, whatever the failure was."""
        if isinstance(exc, UNAVAILABLE):
            self.went_down(exc)
        else:
            self.degrade()

    def background_failed(self, what: str, exc: Exception) -> None:
        """An unexpected failure in the beat or the listener: logged once per series,
        reported by /health, retried with backoff."""
        if self.background_failing is None:
            log.error("cluster %s failed; retrying with backoff", what, exc_info=exc)
        self.background_failing = f"{what}: {type(exc).__name__}: {exc}"
        self.degrade()

    def health(self) -> str:
        """"degraded" while this node cannot write to Redis: unreachable, lost our data
        and not yet copied over again, the journal failing, a background failure."""
        journal_ok = self.journal.alive
        return "ok" if not self.degraded and journal_ok and self.background_failing is None \
            else "degraded"

    # -- registry ----------------------------------------------------------------------

    def add(self, live: LiveSession) -> None:
        self.hold(live, 1)
        self.write_record(live)

    def remove(self, session_id: str, keep: bool = False) -> LiveSession | None:
        if keep:  # this node is stopping: leave the session to the cluster
            held = self.get(session_id)
            if held is not None:
                self.let_go(held, stopping=True)
            return held
        live = super().remove(session_id)
        if live is not None:
            epoch = live.link.epoch if isinstance(live.link, Follow) else 0
            live.link = None
            self.calls.remote.pop(session_id, None)
            self.journal.forget(session_id)
            try:  # only if it is still ours (a node that lost it late must not delete it)
                self.store.delete_if_held(session_id, epoch)
            except UNAVAILABLE as exc:
                self.went_down(exc)
        return live

    def changed(self, live: LiveSession) -> None:
        """Attached or detached: the record's connected / transport fields go with the
        session's next journal batch, fenced like it (a session taken over meanwhile is
        ``lost`` there). An attach waits for that batch, shared by every session in it:
        a transport is served once Redis said this node still holds the session, as
        when the record was a write of its own, without that write's round trip."""
        link = live.link
        if isinstance(link, Follow) and self.get(live.id) is not None:
            link.record_due = True
            if live.transport is None:
                self.journal.note_state(live)
            else:
                self.journal.append(live, link, [], now_ms())

    def hold(self, live: LiveSession, epoch: int, delivered: Iterable[str] = ()) -> None:
        """Hold the session here at ``epoch``, journaling what it writes from now on;
        ``delivered``: the ids of the deliveries applied to it before (its state's)."""
        super().add(live)
        live.link = Follow(self, live.core.downstream_seq, epoch, delivered)

    def unhold(self, session_id: str) -> LiveSession | None:
        """Stop holding the session here (its Redis record stays) and journaling it."""
        live = super().remove(session_id)
        if live is not None:
            self.host.released(live)
            self.journal.forget(session_id)
            if isinstance(live.link, Follow):
                live.link.journaling = False
        return live

    def record_of(self, live: LiveSession) -> dict["FieldT", "EncodableT"]:
        """The session's record for Redis (the store adds node and epoch)."""
        transport = live.transport
        record: dict["FieldT", "EncodableT"] = {
            "user": live.user_id, "connected": int(live.core.connected),
            "transport": transport.kind if transport is not None else ""}
        state = self.journal.state_of(live)
        if state:
            record["state"] = state
        return record

    def write_record(self, live: LiveSession) -> None:
        epoch = live.link.epoch if isinstance(live.link, Follow) else 0
        try:
            if not self.store.write_record(live.id, epoch, self.record_of(live)):
                self.lost([live.id])
        except UNAVAILABLE as exc:
            self.went_down(exc)

    # -- delivery ----------------------------------------------------------------------

    def route(self, session_id: str, item: Operation | Upstream) -> bool:
        if isinstance(item, Upstream):
            return self.forward_upstream(session_id, item.user_id, item.body)
        return self.deliver_remote(session_id, item)

    def deliver_remote(self, session_id: str, op: Operation, hops: int = 0,
                       delivery_id: str | None = None) -> bool:
        """Deliver ``op`` to the node holding the session; ``delivery_id``: the id of a
        delivery another node made (one made here gets this node's next)."""
        item = encode_operation(op)
        # the id the holder skips a second copy by (it moves with the session's state)
        item["did"] = delivery_id or f"{self.node_id}:{next(self._deliveries)}"
        try:
            user, node = self.store.holder(session_id)
            if user is None:
                raise SessionNotFound(f"no session {session_id!r}")
            if node and node != self.node_id and hops < MAX_HOPS:
                # Wait for the holder to queue it, so that what the application sends next,
                # from any node, comes after it.
                reply = self.keys.reply(uuid.uuid4().hex)
                sent = self.store.publish(self.keys.node_channel(node), {
                    "op": "deliver", "sid": session_id, "hops": hops, "reply": reply, **item})
                if sent:
                    answer = self.store.wait_reply(reply, DELIVERY_WAIT)
                    if answer is not None:
                        return answer == b"1"
                    # It died on it, or is stuck: it may have it or not. Not given up while
                    # the session lives: a copy waits in its inbox, as below, and the one
                    # that applies it second (by its id) skips it.
                    log.warning("node %s holding session %s did not confirm %s %s; queued "
                                "again for it or the next holder", node, session_id,
                                op.name, item["did"])
            # No node heard it: the next one to take the session over sends this first, or
            # the holder, if alive but not listening just now, at its next beat.
            self.store.queue(session_id, orjson.dumps(item))
            return True
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    def publish(self, message: dict[str, Any]) -> None:
        try:
            self.store.publish(self.keys.broadcast, {**message, "from": self.node_id})
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable("Redis is unreachable") from exc

    def forward_upstream(self, session_id: str, user_id: str, body: bytes) -> bool:
        """Hand a posted body to the session's holder; or, when the holder does not listen
        just now (its listener reconnecting) or no node holds the session, keep it in the
        session's inbox, where the holder's next beat or the next node to take the session
        over (a resume) finds it. A POST never moves a session: only a resume does, which
        brings the client's resume point."""
        try:
            user, node = self.store.holder(session_id)
            if user is None:
                self.not_found(session_id)
            if user != user_id:
                raise SessionNotFound(f"no session {session_id!r} for this user")
            if node == self.node_id:
                return False  # ours in Redis, not in memory: found (or not) here
            item = {"op": "upstream", "sid": session_id, "user": user_id,
                    "body": base64.b64encode(body).decode()}
            if node:
                # 202 only once the holder has the body: a holder killed right after
                # PUBLISH reached it must not leave a 202 for a body nobody read (a body
                # sent again is harmless: the session skips upstream seqs it has seen)
                reply = self.keys.reply(uuid.uuid4().hex)
                if self.store.publish(self.keys.node_channel(node), {**item, "reply": reply}):
                    if self.store.wait_reply(reply, DELIVERY_WAIT) is None:
                        raise self.unavailable(f"the node holding session {session_id!r} "
                                               "did not confirm the body; post it again")
                    return True
            self.store.queue(session_id, orjson.dumps(item))
            return True
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise self.unavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    unavailable = staticmethod(unavailable)

    def settled(self) -> bool:
        return settled(self.reachable_since, self.store)

    def not_found(self, session_id: str) -> None:
        """No record of the session: SESSION_NOT_FOUND, or 503 while its holder may not
        have written it back yet (Redis lost its data, or came back, a moment ago)."""
        if not self.settled():
            raise self.unavailable(f"session {session_id!r} is not known to the cluster "
                                   "just now (Redis lost data or was unreachable a moment "
                                   "ago); its node may be writing it back")
        raise SessionNotFound(f"no session {session_id!r}")

    def forward_moved(self, session_id: str, op: Operation) -> bool:
        """A delivery to a session that moved away (a tool call still running here)."""
        back = self.get(session_id)
        if back is not None:  # the session came back here while the call ran
            return back.apply(op)
        try:
            return self.deliver_remote(session_id, op)
        except ProtoError as exc:
            log.warning("session %s moved away and %s for it was lost: %s", session_id,
                        op.name, exc)
            return False

    def apply_queued(self, live: LiveSession, items: Iterable[bytes]) -> None:
        """Deliveries and posted bodies that waited in Redis, applied to the session held
        here in the order they came."""
        for raw in items:
            data = orjson.loads(raw)
            if data.get("op") == "upstream":
                self.upstream(live, data)
            elif first_copy(live, data):
                live.run(decode_operation(data))
                apart(self.host.settle, live)  # the session layer acts on the events

    # -- messages from other nodes (the listener calls these) --------------------------

    def on_deliver(self, data: dict[str, Any]) -> None:
        sid = data["sid"]
        op = decode_operation(data)
        live = self.get(sid)
        if live is not None:
            result = live.apply(op) if first_copy(live, data) else True
            apart(self.host.settle, live)  # the session layer acts on the events
            if live.link is not None:  # confirmed once Redis has it: this node may die next
                live.link.persist(live)
            if op.name in ("tool_done", "fail_call") and sid in self.calls.remote:
                self.calls.settle(sid)
        else:  # it moved on since the sender looked
            result = self.deliver_remote(sid, op, data["hops"] + 1, data.get("did"))
        self.store.reply(data["reply"], b"1" if result else b"0")

    def on_upstream(self, data: dict[str, Any]) -> None:
        reply = data.pop("reply", None)
        live = self.get(data["sid"])
        if live is None:  # it moved since the poster looked: to its inbox, for the holder
            self.store.queue(data["sid"], orjson.dumps(data))
        else:
            self.upstream(live, data)
        if reply is not None:
            self.store.reply(reply, b"1")

    def upstream(self, live: LiveSession, data: dict[str, Any]) -> None:
        """A body posted for a session held here, through another node (or its inbox)."""
        if live.user_id != data["user"]:
            return  # the posting node checked the user against the same record
        # in a greenlet of the session layer's (its errors go downstream; the posting node
        # answered the HTTP 400): waited for, never run on this listener's stack
        gevent.spawn(self.host.receive_body, live, base64.b64decode(data["body"])).join()
        if live.link is not None:
            live.link.persist(live)

    def on_broadcast(self, data: dict[str, Any]) -> None:
        if data["from"] != self.node_id:
            self.send_here(messages.from_dict(data["out"]))
            for live in self.sessions():
                apart(self.host.settle, live)

    # -- moving sessions between nodes -------------------------------------------------

    def claim(self, session_id: str, user_id: str,
              last_seq: int | None = None) -> LiveSession | None:
        """Take over a session held elsewhere (its holder lets go first) or by no one, for
        a resume from ``last_seq`` (the last seq its client has)."""
        try:
            user, _ = self.store.holder(session_id)
            if user is None:
                self.not_found(session_id)
            if user != user_id:
                return None
            with self.store.claim_lock(session_id):
                return self._take_over(session_id, last_seq)
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise self.unavailable("cannot resume a session held elsewhere: Redis is "
                                   "unreachable") from exc

    def _take_over(self, session_id: str, last_seq: int | None) -> LiveSession | None:
        """Under the claim lock: have the holder let go, then take the session's record
        (at the next epoch), state, window and queued deliveries in one transaction.

        Only a holder that let go, or one that is gone, gives the session up: one whose
        beat is there but that did not answer (its listener reconnecting, say), or whose
        beat is missing while Redis has not answered this node for SETTLE_MS (an outage:
        the holder may be serving it still), keeps it, and the resume gets a 503."""
        _, holder = self.store.holder(session_id)
        if holder and holder != self.node_id:
            if self.store.node_alive(holder):
                if not self._ask_release(holder, session_id):
                    raise self.unavailable(f"the node holding session {session_id!r} did "
                                           "not hand it over; try again")
            elif not self.settled():
                raise self.unavailable(f"the node holding session {session_id!r} may still "
                                       "be serving it (Redis answered again a moment ago)")
        epoch, state, calls_on, replay, inbox = self.store.take(session_id)
        if state is None or not epoch:
            return None
        now = now_ms()
        core = handoff.restore(decode_state(state), self.host.settings, now,
                               (unpack_entry(item) for item in replay))
        if core.disconnected_at is not None:
            core.disconnected_at = now  # kept replayWindowTime from its move, as any detach
        if last_seq is not None and handoff.continue_after(core, last_seq):
            log.warning("session %s: restored behind its client's seq %d; going on from "
                        "there (REPLAY_UNAVAILABLE sent)", session_id, last_seq)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("session %s taken from %s at epoch %d: state seq %d, window %s-%s, "
                      "client seq %s, %d inbox", session_id, holder or "no node", epoch,
                      core.downstream_seq, core.replay.first_seq, core.replay.last_seq,
                      last_seq, len(inbox))
        live = self.host.adopt(core)
        saved = decode_state(state)
        self.hold(live, epoch, saved.get("delivered") or ())
        for out in saved.get("pending") or ():  # (state.export_journaled)
            live.run(Send(messages.from_dict(out)))
        self.apply_queued(live, inbox)
        self.calls.adopt(live, holder, decode_state(calls_on) if calls_on else {})
        log.info("session %s taken over from %s", session_id, holder or "no node")
        return live

    def _ask_release(self, holder: str, session_id: str) -> bool:
        """Whether the holder let the session go (within RELEASE_WAIT)."""
        reply = self.keys.reply(uuid.uuid4().hex)
        asked = self.store.publish(self.keys.node_channel(holder),
                                   {"op": "release", "sid": session_id, "reply": reply})
        if asked and self.store.wait_reply(reply, RELEASE_WAIT) is not None:
            return True
        log.warning("node %s kept session %s%s", holder, session_id, "" if asked else " (deaf)")
        return False

    def release(self, session_id: str, reply: str) -> None:
        """Another node resumes this session: close our transport (4002), write what we
        hold, let it go (calls running here report there). Not while degraded: what we
        sent since Redis went away is not copied yet (a window with a hole; 503, retried)."""
        live = self.get(session_id)
        if live is None:
            self.let_go.wait(session_id)  # (a drain letting it go: answered once it has)
        elif self.degraded or not self._released(live):
            log.debug("session %s: kept (degraded) against a resume elsewhere", session_id)
            return
        try:
            self.store.reply(reply, b"released")
        except UNAVAILABLE as exc:
            self.went_down(exc)

    def _released(self, live: LiveSession) -> bool:
        self.host.close_transport(live, CloseCode.SUPERSEDED, "resumed on another node")
        if not self.let_go(live):
            return False
        self.calls.moved(live)  # calls still running here report there
        return True

    def _fenced(self, taken: list[str], missing: list[str]) -> None:
        self.lost(taken)
        if missing:
            self.data_lost(f"the records of {len(missing)} sessions are gone")

    def lost(self, session_ids: list[str]) -> None:
        """Another node took these sessions over while this one still held them (it was
        slow to answer, or cut off from Redis): stop serving them here, write nothing."""
        for sid in session_ids:
            live = self.unhold(sid)
            if live is None:
                continue
            log.warning("session %s is held by another node now; dropping it here", sid)
            if isinstance(live.link, Follow):
                live.link.moved = True
            # not 4002: no other client need have taken it; the client resumes it there.
            # Apart (a greenlet of its own, no call back up): it is not this node's now
            apart(self.host.close_transport, live, CloseCode.MOVED, MOVED_REASON)

