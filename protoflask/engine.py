"""The transport-neutral session layer: what every transport calls, and the one place
where core events become signals, tool runs and transport actions.

Transports only frame bytes; they call ``open_connection`` / ``new_session`` or
``find_session`` / ``attach`` / ``receive`` / ``detach`` and write what
``session.core.take_writable`` gives them.
"""

from __future__ import annotations

import gc
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gevent

from .auth import TokenAuthority
from .tickets import MemoryTicketStore, TicketStore
from .config import ServerConfig
from .core import messages
from .core.bodies import is_raw, split_body
from .core.errors import (
    InvalidMessage, InvalidToken, MaxConnections, MessageTooLarge, OutboundQueueFull,
    ProtoError, SessionNotFound, ShuttingDown, UserConnectionLimit,
)
from .core.errors import CloseCode
from .core.session import (
    AudioReceived, CloseRequested,
    ErrorSent, Expired,
    Handshake, HeartbeatTimedOut, ProtocolSession, RunChanged, TextReceived, ToolCallReceived,
    SendRefused, SlowConsumer, ToolCancelRequested, ToolListRequested,
)
from .clock import now_ms
from .hub import Hub, LiveSession, SessionHost, Transport
from .core.traffic import TrafficCounters
from .metrics import ToolCounters
from .tools import SessionToolRunner, ToolExecution, ToolRegistry, check_call
from . import signals

if TYPE_CHECKING:
    from .server import ProtoServer

log = logging.getLogger("protoflask")
access_log = logging.getLogger("protoflask.access")

STATS_WINDOW_MS = 10_000
HISTORY_SECONDS = 300  # per-second samples the dashboard charts (five minutes)


class Stats:
    """The counters of docs/PROTOCOL.md §10 Statistics, plus the plain counters /metrics
    and the dashboard read (docs/OPERATIONS.md): bumped where things happen, never
    through a metrics library on the per-message path."""

    def __init__(self, now: int) -> None:
        self.started_at = now
        self.total_connections = 0
        self.active_connections = 0
        self.total_messages = 0
        self.errors_sent = 0
        # (second, messages, latency sum ms, latency samples) for the last 10 s
        self._buckets: deque[list[float]] = deque()
        self.traffic = TrafficCounters()  # shared by every session's core
        self.connections_active: dict[str, int] = {}  # by transport kind
        self.connections_opened: dict[str, int] = {}
        self.connections_refused: dict[str, int] = {}  # by error code
        self.errors_by_code: dict[str, int] = {}  # ERROR messages sent
        self.outbound_dropped = 0  # OUTBOUND_QUEUE_FULL
        self.runs: dict[str, int] = dict.fromkeys(
            ("started", "finished", "cancelled", "error"), 0)
        self.tools = ToolCounters()
        #: [second start ms, most connections open in it, messages, mean latency ms, errors]
        self.history: deque[list[float]] = deque(maxlen=HISTORY_SECONDS)
        self._sampled_second = now // 1000
        self._errors_at_sample = 0
        self._peak_connections = 0  # since the last sample

    def connection_opened(self, kind: str) -> None:
        self.active_connections += 1
        self.total_connections += 1
        self._peak_connections = max(self._peak_connections, self.active_connections)
        self.connections_active[kind] = self.connections_active.get(kind, 0) + 1
        self.connections_opened[kind] = self.connections_opened.get(kind, 0) + 1

    def connection_closed(self, kind: str) -> None:
        self.active_connections -= 1
        self.connections_active[kind] = self.connections_active.get(kind, 0) - 1

    def count(self, counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def sample(self, now: int) -> None:
        """Once a second (the heartbeat ticker calls it): append the seconds completed
        since the last sample to ``history``, from the 10 s buckets."""
        second = now // 1000
        if second <= self._sampled_second:
            return
        by_second = {int(b[0]): b for b in self._buckets}
        errors = self.errors_sent - self._errors_at_sample
        self._errors_at_sample = self.errors_sent
        peak = max(self._peak_connections, self.active_connections)
        self._peak_connections = self.active_connections
        first = max(self._sampled_second, second - HISTORY_SECONDS)
        for s in range(first, second):
            b = by_second.get(s)
            self.history.append([s * 1000, peak, b[1] if b else 0,
                                 round(b[2] / b[3], 4) if b and b[3] else 0.0,
                                 errors if s == second - 1 else 0])
        self._sampled_second = second

    def record(self, now: int, latency_ms: float) -> None:
        self.total_messages += 1
        second = now // 1000
        buckets = self._buckets
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0.0, 0])
            self._trim(now)
        bucket = buckets[-1]
        bucket[1] += 1
        bucket[2] += latency_ms
        bucket[3] += 1

    def _trim(self, now: int) -> None:
        horizon = (now - STATS_WINDOW_MS) // 1000
        while self._buckets and self._buckets[0][0] <= horizon:
            self._buckets.popleft()

    def snapshot(self, now: int) -> dict[str, Any]:
        self._trim(now)
        uptime = max(1, now - self.started_at)
        window_s = min(STATS_WINDOW_MS, uptime) / 1000.0
        recent = sum(b[1] for b in self._buckets)
        samples = sum(b[3] for b in self._buckets)
        return {
            "totalConnections": self.total_connections,
            "activeConnections": self.active_connections,
            "totalMessages": self.total_messages,
            "messagesPerSecond": round(recent / window_s, 3),
            "averageLatency": round(sum(b[2] for b in self._buckets) / samples, 4)
            if samples else 0.0,
            "errorRate": round(min(1.0, self.errors_sent / self.total_messages), 6)
            if self.total_messages else 0.0,
            "uptime": uptime,
        }


@dataclass(frozen=True)
class Admission:
    """A connection request that passed auth, the owner check and the connection limit.

    ``resume`` is the user's existing session when the request named one."""

    user_id: str
    resume: LiveSession | None
    last_seq: int | None


class Engine:
    def __init__(self, server: "ProtoServer", config: ServerConfig, hub: Hub,
                 tools: ToolRegistry, authority: TokenAuthority) -> None:
        self.server = server
        self.config = config
        self.hub = hub
        self.tools = tools
        self.authority = authority
        self.settings = config.session_settings()
        self.stats = Stats(now_ms())
        self.shutting_down = False
        self._ticker: gevent.Greenlet | None = None
        #: per user: live transports, and POST bodies being read (maxConnectionsPerUser)
        self._user_connections: dict[str, int] = {}
        self._user_bodies: dict[str, int] = {}
        #: per user: ids of this process's disconnected (kept) sessions, oldest first
        self._kept: dict[str, dict[str, None]] = {}
        self._kept_pruned_at = 0
        #: connect tickets (POST /proto/ticket); the server sets a shared one when clustered
        self.tickets: TicketStore = MemoryTicketStore()

        hub.bind(SessionHost(
            settings=self.settings, adopt=self.adopt, close_transport=self._close_transport,
            local_stats=lambda: {**self.stats.snapshot(now_ms()),
                                 "errorsSent": self.stats.errors_sent},
            receive_body=self.receive_body))

    # -- connections -----------------------------------------------------------------

    def authenticate(self, token: str | None, ticket: str | None = None) -> str:
        """The user of a token, or of a connect ticket (redeemed: it works once)."""
        if ticket and not token:
            user_id = self.tickets.redeem(ticket)
            if user_id is None:
                raise InvalidToken("invalid, used or expired connect ticket")
            return user_id
        return self.authority.verify(token)

    def issue_ticket(self, token: str | None) -> tuple[str, int]:
        """A single-use connect ticket for the token's user, and its lifetime in ms."""
        return self.tickets.issue(self.authority.verify(token)), self.tickets.lifetime_ms

    def open_connection(self, kind: str = "unknown", user_id: str | None = None,
                        replacing: bool = False) -> None:
        """Count a live transport of ``kind`` (websocket, sse, stream), or refuse it
        (503 MAX_CONNECTIONS / USER_CONNECTION_LIMIT / SHUTTING_DOWN). ``replacing``: it
        takes over a transport of the same session, which is about to close, so the
        user's cap does not count it twice."""
        if self.shutting_down:
            raise ShuttingDown()
        if self.stats.active_connections >= self.config.max_connections:
            raise MaxConnections(f"{self.config.max_connections} connections are open")
        if user_id is not None:
            held = self._user_connections.get(user_id, 0)
            cap = self.config.connections_per_user
            if held >= cap and not replacing:
                raise UserConnectionLimit(f"this user has {held} live connections open "
                                          f"(maxConnectionsPerUser {cap})")
            self._user_connections[user_id] = held + 1
        self.ensure_running()
        self.stats.connection_opened(kind)

    def close_connection(self, kind: str = "unknown", user_id: str | None = None) -> None:
        self.stats.connection_closed(kind)
        if user_id is not None:
            _release(self._user_connections, user_id)

    def open_body(self, user_id: str) -> None:
        """Count a POST body being read for the user (their own cap, maxConnectionsPerUser
        of them at once), or raise USER_CONNECTION_LIMIT; the caller owes close_body."""
        held = self._user_bodies.get(user_id, 0)
        cap = self.config.connections_per_user
        if held >= cap:
            self.stats.count(self.stats.connections_refused, UserConnectionLimit.code)
            raise UserConnectionLimit(f"this user has {held} request bodies being read "
                                      f"(maxConnectionsPerUser {cap})")
        self._user_bodies[user_id] = held + 1

    def close_body(self, user_id: str) -> None:
        _release(self._user_bodies, user_id)

    def admit(self, token: str | None, session_id: str | None,
              last_seq: int | None, kind: str = "unknown",
              ticket: str | None = None) -> Admission:
        """Let a live transport in, or raise the contract's error (401, 404, 503).

        Counts the connection: the caller owes one
        ``close_connection(kind, admission.user_id)``."""
        try:
            user_id = self.authenticate(token, ticket)
            resume = self.find_session(session_id, user_id) if session_id else None
            self.open_connection(kind, user_id, replacing=resume is not None
                                 and resume.transport is not None)
        except ProtoError as exc:
            self.stats.count(self.stats.connections_refused, exc.code)
            raise
        return Admission(user_id, resume, last_seq)

    def session_for(self, admission: Admission) -> tuple[LiveSession, int | None]:
        """The session an admitted transport attaches to, and the seq to replay after:
        a new session (nothing to replay), or the resumed one from ``last_seq``, by
        default from its last ACK."""
        if admission.resume is None:
            return self.new_session(admission.user_id), None
        last_seq = admission.last_seq
        return admission.resume, admission.resume.core.last_ack if last_seq is None else last_seq

    def new_session(self, user_id: str) -> LiveSession:
        live = self.adopt(ProtocolSession(uuid.uuid4().hex, user_id, self.settings, now_ms(),
                                          self.stats.traffic))
        self.hub.add(live)
        return live

    def adopt(self, core: ProtocolSession) -> LiveSession:
        """A live session around a protocol session (new, or moved here from another node)."""
        core.traffic = self.stats.traffic  # this node counts what it carries
        live = LiveSession(core, self._dispatch)
        live.runner = SessionToolRunner(live, self.server, self.config.max_concurrent_runs,
                                        self.config.tool_queue_size, self.config.tool_timeout,
                                        on_finish=self.stats.tools.finished)
        return live

    def find_session(self, session_id: str | None, user_id: str, *,
                     claim: bool = True) -> LiveSession:
        """The user's own session, or SESSION_NOT_FOUND (also for another user's id).

        In a cluster, ``claim`` moves a session another process holds into this one
        (a resume); without it only this process's sessions are found."""
        live = self.hub.get(session_id) if session_id else None
        if live is None and session_id and claim:
            live = self.hub.claim(session_id, user_id)
        if live is None or live.user_id != user_id or live.core.closed:
            raise SessionNotFound(f"no session {session_id!r} for this user")
        return live

    def held_session(self, session_id: str, user_id: str) -> LiveSession | None:
        """The user's session if this process holds it, else None (SESSION_NOT_FOUND
        for another user's)."""
        if self.hub.get(session_id) is None:
            return None
        return self.find_session(session_id, user_id, claim=False)

    def session_for_body(self, session_id: str, user_id: str,
                         body: bytes) -> LiveSession | None:
        """For a posted body whose session this process does not hold: None once the
        node that holds it took the body (its errors go downstream there), else the
        session, taken over here, or SESSION_NOT_FOUND."""
        if self.hub.forward_upstream(session_id, user_id, body):
            return None
        return self.find_session(session_id, user_id)

    def post_body(self, session_id: str, user_id: str, body: bytes,
                  held: LiveSession | None) -> int:
        """A body posted for a session (``held``: the session if this process held it
        before the body was read), to that session wherever it lives; how many messages
        it carried. Raises InvalidMessage for a body that is not JSON at all (reported
        downstream too), SESSION_NOT_FOUND when no node holds the session."""
        live = held if held is not None else self.session_for_body(session_id, user_id, body)
        if live is None:  # another node holds the session and processes the body
            return len(split_body(body))
        return self.receive_body(live, body)

    def receive_body(self, live: LiveSession, body: bytes) -> int:
        """Hand every message of a posted body to the session; returns how many.

        Each message meets the session's rules (its errors go downstream as ERROR
        messages). A body of which no line is JSON at all is reported in-protocol like a
        non-JSON WebSocket frame and then raised as InvalidMessage (the HTTP 400)."""
        try:
            parts = split_body(body)
        except InvalidMessage:
            self.receive(live, body)
            raise
        for part in parts:
            if is_raw(part):
                self.receive(live, part[0])
            else:
                self.receive_decoded(live, *part)
        return len(parts)

    def open_transport(self, live: LiveSession, transport: Transport,
                       last_seq: int | None) -> None:
        """An admitted transport starts serving its session: attach it and log it open
        (the same for every kind of transport)."""
        self.attach(live, transport, last_seq)
        if self.config.enable_logging:
            access_log.info("%s open session=%s user=%s%s", transport.kind, live.id,
                            live.user_id, "" if last_seq is None
                            else f" resume last_seq={last_seq}")

    def end_transport(self, live: LiveSession, transport: Transport,
                      attached: bool = True) -> None:
        """An admitted transport is done, however it ended: detach it (if it was
        attached), give its connection slot back (``admit`` counted it) and log it
        closed."""
        try:
            if attached:
                self.detach(live, transport)
        finally:
            self.close_connection(transport.kind, live.user_id)
            if self.config.enable_logging:
                access_log.info("%s closed session=%s", transport.kind, live.id)

    def attach(self, live: LiveSession, transport: Transport,
               last_seq: int | None = None) -> None:
        """Give the session a live transport; an older one is closed (4002)."""
        old = live.transport
        if old is not None and old is not transport:
            live.transport = None
            old.close(CloseCode.SUPERSEDED, "superseded by a resumed connection")
        live.core.attach(now_ms(), last_seq)
        live.transport = transport
        kept = self._kept.get(live.user_id)
        if kept is not None:
            kept.pop(live.id, None)
        self.hub.changed(live)
        self._emit(signals.connect, session_id=live.id)
        self._drain_events(live)
        live.notify()

    def detach(self, live: LiveSession, transport: Transport) -> None:
        """The transport is gone; the session is kept for resume (replayWindowTime)."""
        if live.transport is not transport:
            return
        live.transport = None
        live.core.detach(now_ms())
        self.hub.changed(live)
        self._keep(live)
        self._emit(signals.disconnect, session_id=live.id)

    # -- upstream --------------------------------------------------------------------

    def receive(self, live: LiveSession, raw: bytes | str) -> None:
        started = now_ms()
        live.core.receive(raw, started)
        self._drain_events(live)
        live.notify()
        finished = now_ms()
        self.stats.record(finished, finished - started)

    def receive_decoded(self, live: LiveSession, obj: Any, nbytes: int) -> None:
        started = now_ms()
        live.core.receive_decoded(obj, nbytes, started)
        self._drain_events(live)
        live.notify()
        finished = now_ms()
        self.stats.record(finished, finished - started)

    def receive_binary(self, live: LiveSession, data: bytes) -> None:
        self._emit(signals.binary, session_id=live.id, data=data)

    def reject(self, live: LiveSession, exc: ProtoError) -> None:
        """A transport-level problem with one upstream message, reported in-protocol
        (an ERROR message) and counted like any received message."""
        started = now_ms()
        live.core.reject(exc)
        self._drain_events(live)
        live.notify()
        finished = now_ms()
        self.stats.record(finished, finished - started)

    def too_large(self, live: LiveSession, exc: MessageTooLarge, *,
                  close: bool = False) -> None:
        """An upstream message too large for its transport to take whole (a WebSocket
        message, an NDJSON line, a POST body): the core's MESSAGE_TOO_LARGE, reported
        in-protocol; with ``close``, the transport is then closed with 1009 as the core
        closes one for an oversized message it read itself. Each transport frames the rest
        its own way (the WebSocket's 1009, the POST's 413, the stream's last line)."""
        self.reject(live, exc)
        if close:
            self._close_transport(live, CloseCode.TOO_LARGE, "message too large")

    # -- dispatch: core events -> signals, tools, transports -------------------------

    def _drain_events(self, live: LiveSession) -> None:
        self._dispatch(live, live.core.take_events())

    def _dispatch(self, live: LiveSession, events: list[Any]) -> None:
        while events:
            for event in events:
                self._handle(live, event)
            events = live.core.take_events()

    def _handle(self, live: LiveSession, event: Any) -> None:
        sid = live.id
        if isinstance(event, TextReceived):
            self._emit(signals.text_message, session_id=sid, message=event.message)
        elif isinstance(event, ToolCallReceived):
            self._start_call(live, event)
        elif isinstance(event, ErrorSent):
            self.stats.errors_sent += 1
            self.stats.count(self.stats.errors_by_code, event.error.code)
            self._emit(signals.error, error=event.error, session_id=sid)
        elif isinstance(event, Handshake):
            self._emit(signals.handshake, session_id=sid, payload=event.payload)
        elif isinstance(event, ToolCancelRequested):
            assert live.runner is not None
            if not live.runner.cancel(event.call_id):
                self.hub.cancel_elsewhere(sid, event.call_id)  # started on another node
        elif isinstance(event, ToolListRequested):
            live.core.send(messages.tool_list(t.to_dict() for t in self.tools))
        elif isinstance(event, RunChanged):
            signal = {"started": signals.run_started, "finished": signals.run_finished,
                      "cancelled": signals.run_cancelled}[event.kind]
            self.stats.runs[event.kind if event.kind != "finished" else event.run.status] += 1
            for call_id in event.cancelled_calls:
                assert live.runner is not None
                if not live.runner.cancel(call_id):
                    self.hub.cancel_elsewhere(sid, call_id)
            self._emit(signal, session_id=sid, run=event.run)
        elif isinstance(event, AudioReceived):
            self._emit(signals.audio_chunk, session_id=sid, message=event.message,
                       data=event.data)
        elif isinstance(event, CloseRequested):
            self._close_transport(live, event.code, event.reason)
        elif isinstance(event, HeartbeatTimedOut):
            log.info("session %s: no PONG within %d ms; disconnecting", sid,
                     self.config.heartbeat_timeout)
            self._close_transport(live, CloseCode.HEARTBEAT, "heartbeat timeout")
        elif isinstance(event, SlowConsumer):
            log.warning("session %s: client is not reading (%d bytes unsent); dropping its "
                        "connection, the session stays for resume", sid, event.unsent_bytes)
            self._close_transport(live, CloseCode.SLOW_CONSUMER, "outbound buffer full")
        elif isinstance(event, SendRefused):
            self.stats.outbound_dropped += 1
            log.warning("session %s: pending queue full; %s on %s dropped", sid, event.type,
                        event.channel)
            self._emit_error(OutboundQueueFull(
                f"{event.type} on {event.channel} dropped: {len(live.core.pending)} messages "
                "are waiting for the client's credit or RESUME_CHANNEL"), session_id=sid)
        elif isinstance(event, Expired):
            self._expire(live)

    def _start_call(self, live: LiveSession, event: ToolCallReceived) -> None:
        tool = self.tools.get(event.tool)
        try:
            check_call(tool, event.tool, event.params)
        except ProtoError as exc:
            live.core.fail_call(event.call_id, exc)
            return
        assert tool is not None and live.runner is not None
        execution = ToolExecution(event.call_id, tool.name, event.params, run_id=event.run_id)
        self.hub.state_changed(live)  # the open call, for a node that may take it over
        self._emit(signals.tool_call, session_id=live.id, execution=execution)
        if tool.execute is not None:
            live.runner.submit(execution, tool)

    def _close_transport(self, live: LiveSession, code: int, reason: str) -> None:
        transport = live.transport
        if transport is not None:
            live.notify()
            transport.close(code, reason)
            self.detach(live, transport)

    def _keep(self, live: LiveSession) -> None:
        """A session just disconnected: the user's oldest disconnected sessions beyond
        maxKeptSessionsPerUser are dropped (as if they had expired)."""
        kept = self._kept.setdefault(live.user_id, {})
        kept.pop(live.id, None)
        kept[live.id] = None  # newest last
        if len(kept) <= self.config.max_kept_sessions_per_user:
            return
        for sid in list(kept):
            if len(kept) <= self.config.max_kept_sessions_per_user:
                break
            other = self.hub.get(sid)
            if other is None or other.core.closed or other.transport is not None:
                del kept[sid]  # gone or connected again meanwhile
            else:
                log.info("session %s: user %s keeps more than %d disconnected sessions; "
                         "dropping the oldest", sid, live.user_id,
                         self.config.max_kept_sessions_per_user)
                other.core.close()
                self._expire(other)

    def _prune_kept(self, now: int) -> None:
        """Forget kept ids whose sessions went away without passing _expire here (taken
        over by another node); once a minute."""
        if now - self._kept_pruned_at < 60_000:
            return
        self._kept_pruned_at = now
        for user in list(self._kept):
            kept = self._kept[user]
            for sid in [s for s in kept if self.hub.get(s) is None]:
                del kept[sid]
            if not kept:
                del self._kept[user]

    def _expire(self, live: LiveSession) -> None:
        kept = self._kept.get(live.user_id)
        if kept is not None:
            kept.pop(live.id, None)
            if not kept:
                del self._kept[live.user_id]
        self.hub.remove(live.id)
        if live.runner is not None:
            live.runner.cancel_all()

    # -- timers ----------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Start the heartbeat / expiry ticker in the serving hub, once."""
        if self._ticker is None or self._ticker.dead:
            # What exists now (modules, app, config) lives as long as the process: keep
            # it out of every future full collection, whose pauses are the latency tail.
            gc.collect()
            gc.freeze()
            self._ticker = gevent.spawn(self._tick_forever)
            self.hub.start()

    def tick_period(self) -> float:
        c = self.config
        return max(0.02, min(1.0, min(c.heartbeat_interval, c.heartbeat_timeout) / 4000.0))

    def _tick_forever(self) -> None:
        period = self.tick_period()
        while True:
            gevent.sleep(period)
            try:
                self.tick()
            except Exception as exc:  # never let one bad session stop the heartbeat
                log.exception("heartbeat tick failed")
                self._emit_error(exc)

    def tick(self) -> None:
        now = now_ms()
        self.stats.sample(now)
        self._prune_kept(now)
        for live in self.hub.sessions():
            live.core.tick(now)
            self._drain_events(live)
            live.notify()

    def stop_timers(self) -> None:
        if self._ticker is not None:
            self._ticker.kill(block=False)
            self._ticker = None
        self.hub.stop()

    # -- signals ---------------------------------------------------------------------

    def _emit(self, signal: Any, **kwargs: Any) -> None:
        self.server._emit(signal, **kwargs)

    def _emit_error(self, exc: BaseException, **kwargs: Any) -> None:
        self.server._emit_error(exc, **kwargs)


def _release(counts: dict[str, int], user_id: str) -> None:
    left = counts.get(user_id, 0) - 1
    if left > 0:
        counts[user_id] = left
    else:
        counts.pop(user_id, None)
