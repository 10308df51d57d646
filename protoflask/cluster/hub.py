"""RedisHub: the session registry and delivery shared by every worker and node.

The routing (where each session lives, delivering and moving sessions, degraded mode)
is ``RoutingHub``'s (``routing``); this adds what keeps the cluster's view fresh, in two
greenlets: the beat (this node is alive, its figures and /metrics text, the expiry of its
sessions, deliveries queued for it, calls running on nodes that may die, and the way out
of degraded mode: every local session copied over again), and the listener on this
node's pub/sub channel. What it reads of the cluster for /stats, /metrics and the
dashboard is its ``view`` (``view``).
A node that stops beating drops out of the counts and its sessions read as disconnected
until they expire.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import orjson

from ..clock import now_ms
from .letgo import copy_over
from .nodes import node_meta
from .redis_client import UNAVAILABLE
from .routing import BEAT_MS, NODE_TTL_MS, RoutingHub
from .tickets import RedisTicketStore
from .view import RedisView

if TYPE_CHECKING:
    from ..config import ServerConfig

log = logging.getLogger("protoflask.cluster")

MARKER_TTL_MS = 60_000  # a marker that outlives any beat: gone means Redis lost our data
SUBSCRIBE_WAIT = 2.0  # s start() waits for this node's channel subscription
STOP_SETTLE = 2.0  # s stop() waits for the cancelled calls' TOOL_DONEs to be delivered


def backoff(failures: int) -> float:
    """Seconds before the next attempt: 0.1, 0.2, 0.4 ... up to 1 (a node must be back
    well within SETTLE_MS of Redis answering again: its sessions wait for it)."""
    return min(1.0, 0.1 * 2.0 ** min(failures - 1, 6))


class RedisHub(RoutingHub):
    def __init__(self, url: str, prefix: str = "protoflask", *,
                 node_id: str | None = None, config: "ServerConfig | None" = None) -> None:
        super().__init__(url, prefix, node_id=node_id, config=config)
        self.view: RedisView = RedisView(self)
        self.tickets = RedisTicketStore(self.redis, self.keys.prefix)
        self._greenlets: list[gevent.Greenlet] = []
        self._subscribed = gevent.event.Event()
        self._channel = self.keys.node_channel(self.node_id)
        self._handle_failing: str | None = None  # the listener's last message failure

    def start(self) -> None:
        if self._greenlets:
            return
        self.journal.start()
        try:
            self.store.note_no_loss()
        except UNAVAILABLE as exc:
            self.went_down(exc)
        self._greenlets = [gevent.spawn(self._beat_forever), gevent.spawn(self._listen_forever)]
        # Serve once other nodes can reach this one (else their first deliveries would
        # wait in Redis for the next beat).
        self._subscribed.wait(SUBSCRIBE_WAIT)

    def stop(self) -> None:
        # calls still running here for sessions that moved to other nodes: their one
        # TOOL_DONE (CANCELLED) goes to the holder while Redis is still ours, not an
        # ERROR from the holder's watch once this node's beat is gone
        runners = [live.runner for live in list(self.calls.moved_away.values())
                   if live.runner is not None]
        for runner in runners:
            runner.cancel_all()
        # the session layer applies the cancels' reports in a greenlet of its own (their
        # runner's bell): wait for it while Redis is still ours (bounded)
        deadline = time.monotonic() + STOP_SETTLE
        while any(r.reports or r.pulling for r in runners) and time.monotonic() < deadline:
            gevent.sleep(0.01)
        gevent.killall(self._greenlets, block=True, timeout=2)
        self._greenlets = []
        self.journal.stop()
        try:
            self.store.leave()
        except UNAVAILABLE:
            pass
        self.redis.connection_pool.disconnect()

    def node_meta(self) -> dict[str, Any]:
        return node_meta(self.node_id, self.sessions(),
                         self.host.local_stats()["errorsSent"])

    # -- background: beat, listen, recover ---------------------------------------------

    def _recover(self) -> None:
        """Redis takes writes again: journal from now on, copy every local session over
        again (a message stamped meanwhile is in the copy, or appended after it; the
        journal skips what the copy already holds), then deliver what was queued for
        them meanwhile. Anything failing on the way leaves the node degraded, and the
        next beat starts again."""
        self.journal.paused = False
        for live in self.sessions():
            copy_over(self, live)
        self.drain_inboxes()
        if self.journal.paused:  # a write failed meanwhile (it said why)
            return
        self.journal.resumed()
        self.degraded = False
        self.reachable_since = now_ms()
        log.warning("Redis at %s takes writes again; %d sessions copied over", self.url,
                    len(self))

    def drain_inboxes(self, session_ids: list[str] | None = None) -> None:
        held = self.sessions() if session_ids is None else \
            [live for sid in session_ids if (live := self.get(sid)) is not None]
        for live in held:
            items = self.store.take_inbox(live.id)
            if items:
                self.apply_queued(live, items)

    # -- the beat ------------------------------------------------------------------------

    def _beat_forever(self) -> None:
        beats = 0
        failures = 0
        refreshed_at = 0
        while True:
            try:
                now = now_ms()
                report = {**self.host.local_stats(), **self.node_meta()}
                refresh: list[str] = []
                if now - refreshed_at >= self.ttl_ms // 3:
                    refresh = [live.id for live in self.sessions()]
                    refreshed_at = now
                self.calls.forget_finished_moves()
                if self.calls.remote:
                    self.calls.watch()
                source = self.view.metrics_source
                kept, waiting = self.store.beat(
                    now, orjson.dumps(report), source() if source is not None else None,
                    NODE_TTL_MS, MARKER_TTL_MS, 10 * NODE_TTL_MS, refresh)
                if waiting:  # deliveries that found this node alive but not listening
                    self.drain_inboxes(waiting)
                if not kept and beats:
                    self.store.note_loss(now)  # others answer 503, not 404, meanwhile
                    if not self.degraded:
                        self.data_lost("this node's marker key is gone")
                beats += 1
                if self.degraded:
                    self._recover()
                failures = 0
                if self.background_failing is not None:
                    log.warning("cluster beat works again")
                    self.background_failing = None
                gevent.sleep(BEAT_MS / 1000.0)
            except UNAVAILABLE as exc:
                self.went_down(exc)
                failures += 1
                gevent.sleep(backoff(failures))
            except Exception as exc:  # noqa: BLE001 - the beat must outlive any bug or reply
                self.background_failed("beat", exc)
                failures += 1
                gevent.sleep(backoff(failures))

    # -- the listener --------------------------------------------------------------------

    def _listen_forever(self) -> None:
        failures = 0
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self._channel, self.keys.broadcast)
                self._subscribed.set()
                if failures:
                    self.drain_inboxes()  # deliveries made while we could not hear them
                failures = 0
                for message in pubsub.listen():
                    self._handle(message)
            except UNAVAILABLE as exc:
                self.went_down(exc)
                failures += 1
                gevent.sleep(backoff(failures))
            except Exception as exc:  # noqa: BLE001 - keep listening whatever happened
                self.background_failed("listener", exc)
                failures += 1
                gevent.sleep(backoff(failures))
            finally:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - a dead connection may not close cleanly
                    pass

    def _handle(self, message: dict[str, Any]) -> None:
        """One message from another node: "deliver", "broadcast", "upstream" (a POSTed
        body), "release" (a resume elsewhere) or "cancel" (a tool call running here)."""
        try:
            data = orjson.loads(message["data"])
            op = data["op"]
            if op == "deliver":
                self.on_deliver(data)
            elif op == "broadcast":
                self.on_broadcast(data)
            elif op == "upstream":
                self.on_upstream(data)
            elif op == "release":
                self.release(data["sid"], data["reply"])
            elif op == "cancel":
                if data["from"] != self.node_id:
                    self.calls.cancel(data["sid"], data["call"])
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
