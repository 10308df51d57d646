"""A hub shared by the nodes of a cluster: routing on top of the local registry.

Each process (a "node": one gunicorn worker, or one server) holds its own sessions in
memory, exactly like the LocalHub this extends, and adds only routing through Redis (the
operations: ``store``; the keys: ``keys``):

- who holds each session, so a delivery, a posted body or a resume made anywhere finds
  it: deliveries and bodies go to the holder over its pub/sub channel; a resume moves the
  session here (the holder closes its transport with 4002 and writes what it had);
- each session's state and replay window (``journal``), so when its node dies any other
  node can take it over and replay every message the client may have missed.

Redis being unreachable degrades, it does not stop: local sessions keep working from
memory, ``health()`` says "degraded", what only Redis can do raises ClusterUnavailable.
Degraded mode is entered here (``degrade``) and left by the beat's recovery (``hub``).
Tool calls belong to the node that runs them (``calls``).
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

import orjson

from ..core import handoff, messages
from ..clock import now_ms
from ..core.errors import ClusterUnavailable, CloseCode, ProtoError, SessionNotFound
from ..hub import (
    LiveSession,
    LocalHub,
    Operation,
    Send,
    SessionHost,
    decode_operation,
    encode_operation,
)
from .calls import RemoteCalls
from .journal import Journal, decode_state
from .keys import Keys, unpack_entry
from .redis_client import UNAVAILABLE, connect
from .store import RELEASE_WAIT, RedisStore

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

log = logging.getLogger("protoflask.cluster")

BEAT_MS = 1000  # how often a node says it is alive
NODE_TTL_MS = 3000  # a node that missed this long is gone (its sessions read disconnected)
DELIVERY_WAIT = 3.0  # s a delivery to another node waits for that node to confirm it
MAX_HOPS = 3  # re-routing of a delivery that raced a session's move


def default_node_id() -> str:
    """Random: the public /stats and /health show node ids, never where nodes run (host
    and pid are in each node's figures, for an authenticated /stats)."""
    return uuid.uuid4().hex[:12]


class Follow:
    """This node's record of a session it holds or held (the ``SessionLink`` it sets on
    the LiveSession): whether its messages are journaled, up to which seq, and whether it
    moved to another node (then deliveries made here, say by a tool call still running
    here, are forwarded there)."""

    __slots__ = ("hub", "journaled_seq", "journaling", "moved")

    def __init__(self, hub: "RoutingHub", journaled_seq: int) -> None:
        self.hub = hub
        self.journaled_seq = journaled_seq
        self.journaling = True
        self.moved = False

    def written(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int) -> bool:
        if not self.journaling:
            return True
        self.hub.journal.append(live, self, ready, now)
        return not self.moved  # taken over by another node meanwhile: not ours to send

    def written_then(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int,
                     then: Callable[[], None]) -> bool:
        if not self.journaling:
            return False
        self.hub.journal.append(live, self, ready, now, then)
        return True

    def deliver(self, live: LiveSession, op: Operation) -> bool:
        if self.moved:
            return self.hub.forward_moved(live.id, op)
        return live.run(op)


class RoutingHub(LocalHub):
    """Sessions held here, found from anywhere; the background work that keeps the
    cluster's view fresh is the subclass's (``RedisHub``)."""

    clustered = True

    def __init__(self, url: str, prefix: str = "protoflask", *,
                 node_id: str | None = None) -> None:
        super().__init__()
        self.url = url
        self.redis = connect(url)
        self.keys = Keys(prefix)
        self.node_id = node_id or default_node_id()
        self.store = RedisStore(self.redis, self.keys, self.node_id)
        self.calls = RemoteCalls(self.store, self.get, self.cancel_elsewhere)
        self.degraded = False
        self.background_failing: str | None = None  # the beat's last unexpected failure
        self._journal: Journal | None = None

    def bind(self, host: SessionHost) -> None:
        super().bind(host)
        s = host.settings
        self.store.ttl_ms = s.replay_window_time + NODE_TTL_MS + BEAT_MS
        self._journal = Journal(self.redis, self.keys, self.node_id, s.replay_window_size,
                                self.ttl_ms, self.journal_failed, self._fenced)

    @property
    def ttl_ms(self) -> int:
        return self.store.ttl_ms

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "RedisHub used before an engine bound it"
        return self._journal

    # -- degraded mode -------------------------------------------------------------------

    def degrade(self, first: str | None = None) -> None:
        """Enter degraded mode (the journal pauses); ``first`` is logged unless it was
        degraded already."""
        if first is not None and not self.degraded:
            log.error("%s", first)
        self.degraded = True
        if self._journal is not None:
            self._journal.paused = True

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
        journal_ok = self._journal is None or self._journal.alive
        return "ok" if not self.degraded and journal_ok and self.background_failing is None \
            else "degraded"

    # -- registry ----------------------------------------------------------------------

    def add(self, live: LiveSession) -> None:
        self.hold(live)
        self.write_record(live)

    def remove(self, session_id: str) -> LiveSession | None:
        live = super().remove(session_id)
        if live is not None:
            live.link = None
            self.calls.remote.pop(session_id, None)
            self.journal.forget(session_id)
            try:  # only if it is still ours (a node that lost it late must not delete it)
                self.store.delete_if_held(session_id)
            except UNAVAILABLE as exc:
                self.went_down(exc)
        return live

    def changed(self, live: LiveSession) -> None:
        if self.get(live.id) is not None:
            self.write_record(live)

    def state_changed(self, live: LiveSession) -> None:
        if self.get(live.id) is not None:
            self.journal.note_state(live)

    def hold(self, live: LiveSession) -> None:
        """Hold the session here, journaling what it writes from now on."""
        super().add(live)
        live.link = Follow(self, live.core.downstream_seq)

    def unhold(self, session_id: str) -> LiveSession | None:
        """Stop holding the session here (its Redis record stays) and journaling it."""
        live = super().remove(session_id)
        if live is not None:
            self.journal.forget(session_id)
            if isinstance(live.link, Follow):
                live.link.journaling = False
        return live

    def write_record(self, live: LiveSession) -> None:
        transport = live.transport
        record: dict["FieldT", "EncodableT"] = {
            "user": live.user_id, "node": self.node_id, "connected": int(live.core.connected),
            "transport": transport.kind if transport is not None else ""}
        state = self.journal.state_of(live)
        if state:
            record["state"] = state
        try:
            self.store.write_record(live.id, record)
        except UNAVAILABLE as exc:
            self.went_down(exc)

    # -- delivery ----------------------------------------------------------------------

    def deliver(self, session_id: str, op: Operation) -> bool:
        live = self.get(session_id)
        if live is not None:
            return live.apply(op)
        return self.deliver_remote(session_id, op)

    def deliver_remote(self, session_id: str, op: Operation, hops: int = 0) -> bool:
        item = encode_operation(op)
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
                    if answer is None:
                        log.warning("node %s did not confirm %s for session %s within %.0fs",
                                    node, op.name, session_id, DELIVERY_WAIT)
                        return True
                    return answer == b"1"
            # No node heard it: the next one to take the session over sends this first, or
            # the holder, if alive but not listening just now, at its next beat.
            self.store.queue(session_id, orjson.dumps(item), node)
            return True
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    def broadcast(self, out: messages.Outbound) -> int:
        reached = super().broadcast(out)
        try:
            self.store.publish(self.keys.broadcast,
                               {"op": "broadcast", "from": self.node_id, "out": out.to_dict()})
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable(
                f"broadcast reached {reached} sessions on this node; Redis is unreachable, "
                "so other nodes' sessions were not reached") from exc
        return reached

    def forward_upstream(self, session_id: str, user_id: str, body: bytes) -> bool:
        try:
            user, node = self.store.holder(session_id)
            if user is None or user != user_id:
                raise SessionNotFound(f"no session {session_id!r} for this user")
            if not node or node == self.node_id:
                return False
            return bool(self.store.publish(self.keys.node_channel(node), {
                "op": "upstream", "sid": session_id, "user": user_id,
                "body": base64.b64encode(body).decode()}))
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable(
                f"session {session_id!r} is not on this node and Redis is unreachable") from exc

    def cancel_elsewhere(self, session_id: str, call_id: str) -> None:
        try:
            self.store.publish(self.keys.broadcast, {
                "op": "cancel", "from": self.node_id, "sid": session_id, "call": call_id})
        except UNAVAILABLE as exc:
            self.went_down(exc)  # the client has its TOOL_DONE CANCELLED already

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
        """Deliveries that waited in Redis, applied to the session held here."""
        for raw in items:
            live.run(decode_operation(orjson.loads(raw)))

    # -- messages from other nodes (the listener calls these) --------------------------

    def on_deliver(self, data: dict[str, Any]) -> None:
        sid = data["sid"]
        op = decode_operation(data)
        live = self.get(sid)
        if live is not None:
            result = live.apply(op)
            if op.name in ("tool_done", "fail_call") and sid in self.calls.remote:
                self.calls.settle(sid)
        else:  # it moved on since the sender looked
            result = self.deliver_remote(sid, op, data["hops"] + 1)
        self.store.reply(data["reply"], b"1" if result else b"0")

    def on_upstream(self, data: dict[str, Any]) -> None:
        live = self.get(data["sid"])
        if live is None or live.user_id != data["user"]:
            log.warning("a body posted for session %s arrived after it moved; dropped",
                        data["sid"])
            return
        try:
            self.host.receive_body(live, base64.b64decode(data["body"]))
        except ProtoError:
            pass  # already reported downstream; the posting node answered the HTTP 400

    def on_broadcast(self, data: dict[str, Any]) -> None:
        if data["from"] != self.node_id:
            LocalHub.broadcast(self, messages.from_dict(data["out"]))

    # -- moving sessions between nodes -------------------------------------------------

    def claim(self, session_id: str, user_id: str) -> LiveSession | None:
        """Take over a session held elsewhere (asking its holder to let go) or by no one."""
        try:
            user, _ = self.store.holder(session_id)
            if user is None or user != user_id:
                return None
            with self.store.claim_lock(session_id):
                return self._take_over(session_id)
        except UNAVAILABLE as exc:
            self.went_down(exc)
            raise ClusterUnavailable("cannot resume a session held elsewhere: Redis is "
                                     "unreachable") from exc

    def _take_over(self, session_id: str) -> LiveSession | None:
        """Under the claim lock: ask a live holder to let go, then take the session's
        record, state, window and queued deliveries in one transaction."""
        _, holder = self.store.holder(session_id)
        if holder and holder != self.node_id and self.store.node_alive(holder):
            self._ask_release(holder, session_id)
        state, calls_on, replay, inbox = self.store.take(session_id)
        if state is None:
            return None
        now = now_ms()
        core = handoff.restore(decode_state(state), self.host.settings, now,
                               (unpack_entry(item) for item in replay))
        if core.disconnected_at is not None:
            core.disconnected_at = now  # kept replayWindowTime from its move, as any detach
        live = self.host.adopt(core)
        self.hold(live)
        self.apply_queued(live, inbox)
        self.calls.adopt(live, holder, decode_state(calls_on) if calls_on else {})
        log.info("session %s taken over from %s", session_id, holder or "no node")
        return live

    def _ask_release(self, holder: str, session_id: str) -> None:
        reply = self.keys.reply(uuid.uuid4().hex)
        asked = self.store.publish(self.keys.node_channel(holder),
                                   {"op": "release", "sid": session_id, "reply": reply})
        if asked and self.store.wait_reply(reply, RELEASE_WAIT) is None:
            log.warning("node %s did not hand session %s over within %.0fs; taking it",
                        holder, session_id, RELEASE_WAIT)

    def release(self, session_id: str, reply: str) -> None:
        """Another node resumes this session: close our transport (4002), write what we
        hold, and let it go. Tool calls still running here report there."""
        live = self.get(session_id)
        if live is not None:
            self.host.close_transport(live, CloseCode.SUPERSEDED, "resumed on another node")
            self._let_go(live)
            self._moved(live)
        try:
            self.store.reply(reply, b"released")
        except UNAVAILABLE as exc:
            self.went_down(exc)

    def _moved(self, live: LiveSession) -> None:
        if isinstance(live.link, Follow):
            live.link.moved = True
        self.calls.moved(live)

    def _let_go(self, live: LiveSession) -> None:
        """Write a session's whole state, and messages still waiting for credit, and stop
        holding it (its Redis record stays for whoever resumes it)."""
        live.take_writable(now_ms())
        self.journal.flush()
        waiting = live.core.outbound.take_pending()
        self.unhold(live.id)
        calls_on = self.calls.let_go(live)
        try:
            written = self.store.let_go(
                live.id, live.user_id, self.journal.state_of(live), calls_on,
                (orjson.dumps(encode_operation(Send(ob))) for ob in waiting))
            if not written:
                log.warning("session %s was taken over by another node before this one let "
                            "it go; its state here is dropped", live.id)
        except UNAVAILABLE as exc:
            self.went_down(exc)

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
            self.host.close_transport(live, CloseCode.SUPERSEDED, "resumed on another node")

    def hand_off(self, live: LiveSession) -> None:
        """This node is stopping: leave the session to the cluster for a resume elsewhere."""
        if self.get(live.id) is not None:
            self._let_go(live)
