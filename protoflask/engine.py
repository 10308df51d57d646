"""The transport-neutral session layer: what every transport calls (admission, the
sessions' lifecycle, upstream messages), the heartbeat ticker, and the operations the
server's public API runs on sessions. What core events become is ``dispatch.py``'s.

Transports only frame bytes, through a ``port.SessionPort`` each, which calls this. The
engine knows the server above it only through ``emit``, ``emit_error`` and the tools'
context (``tools.ToolContext``), and hands the hub below it a ``SessionHost``.
"""

from __future__ import annotations

import logging
from . import ids
from contextlib import suppress
from functools import partial
from typing import Any, Callable, TypeAlias

from .auth import TokenAuthority
from .bell import Bell, soon
from .budget import MemoryBudget
from .ticker import Ticker, tick_period
from .tickets import MemoryTicketStore, TicketStore, issue_ticket
from .config import ServerConfig
from .clock import now_ms, now_ns
from .core.bodies import TURN, is_raw, iter_body
from .core.errors import (
    CloseCode, InvalidMessage, InvalidToken, MaxConnections, MessageTooLarge, ProtoError,
    SessionNotFound, ShuttingDown, UserConnectionLimit,
)
from .core.session import ProtocolSession
from .dispatch import Dispatcher
from .hub import Hub, SessionHost, Upstream
from .live import LiveSession, Operation, Transport
from .kept import KeptSessions
from .limits import user_caps
from .stats import Stats, held_of
from .wheel import HeartbeatWheel
from .tool_runner import CallSink, SessionToolRunner
from .tools import ToolContext, ToolExecution, ToolRegistry, check_call
from .turns import SLICE_MS, Pacer, give_turn
from . import signals

log = logging.getLogger("protoflask")
access_log = logging.getLogger("protoflask.access")

#: Messages of a posted body handled between two turns for the other greenlets: a slice
#: of the smallest messages costs about a millisecond of the worker.
BODY_SLICE = 256

#: ``emit(signal, **kwargs)`` and ``emit_error(exception, **kwargs)``: ``signals.emit`` and
#: ``signals.emit_error`` bound to the server (the signals' sender)
Emit: TypeAlias = Callable[..., None]


class Engine:
    """The session layer of one process: admits transports, feeds the cores, hands their
    events to its ``Dispatcher``."""

    def __init__(self, config: ServerConfig, hub: Hub, tools: ToolRegistry,
                 authority: TokenAuthority, *, emit: Emit, emit_error: Emit,
                 tool_context: ToolContext | None = None,
                 tickets: TicketStore | None = None) -> None:
        self.config, self.hub, self.tools, self.authority = config, hub, tools, authority
        self._emit, self._emit_error = emit, emit_error
        self.tool_context = tool_context  # every tool's execute is given it last
        self.settings = config.session_settings()
        self.stats = Stats(now_ms())
        self.shutting_down = False
        self._ticker = Ticker(self.tick, tick_period(config), self._emit_error)
        self.user_caps = user_caps(config)  # the per-user cap, and the light users' reserve
        #: transports replaced by a resume whose slot was given back before they ended
        #: (by id; the transport is held so its id is not reused meanwhile)
        self._released: dict[int, Transport] = {}
        self.pacer = Pacer()  # costly turns pause their user (turns.py)
        self.kept = KeptSessions(hub, config.max_kept_sessions_per_user, self._expire)
        self.wheel = HeartbeatWheel(config, hub, self.settle)  # wheel.py
        self.budget = MemoryBudget(config.max_user_bytes, config.memory_ceiling, self.kept,
                                   self._drop_for_memory)
        #: connect tickets (POST /proto/ticket): in memory, or shared when clustered
        self.tickets: TicketStore = tickets if tickets is not None else MemoryTicketStore()
        self.dispatcher = Dispatcher(
            hub=hub, tools=tools, stats=self.stats, emit=emit, emit_error=emit_error,
            close_transport=self.close_transport, expire=self._expire,
            tool_runner=self.tool_runner, settle_calls=self.settle_calls,
            heartbeat_timeout=config.heartbeat_timeout)
        self._dispatch = self.dispatcher.dispatch
        hub.bind(SessionHost(settings=self.settings, adopt=self.adopt,
                             close_transport=self.close_transport,
                             local_stats=self.stats.figures, receive_body=self.receive_forwarded,
                             # released: rung (bell.soon): the charge given back on the loop's stack
                             settle=self.settle, released=partial(soon, self.budget.forget)))

    def local_stats(self) -> dict[str, Any]:
        """This node's statistics (docs/PROTOCOL.md §10) now, and ``errorsSent``."""
        return self.stats.figures()

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
        return issue_ticket(self.tickets, *self.authority.verify_with_expiry(token))

    def open_connection(self, kind: str = "unknown", user_id: str | None = None,
                        replacing: bool = False) -> None:
        """Count a live transport of ``kind``, or refuse it (503 MAX_CONNECTIONS /
        USER_CONNECTION_LIMIT / SHUTTING_DOWN). ``replacing``: it takes over a transport of
        the same session, about to close: the user's cap does not count it twice."""
        if self.shutting_down:
            raise ShuttingDown()
        if self.stats.active_connections >= self.config.max_connections:
            raise MaxConnections(f"{self.config.max_connections} connections are open")
        if user_id is not None:
            self.user_caps.take_connection(user_id, replacing)
        self.ensure_running()
        self.stats.connection_opened(kind)

    def close_connection(self, kind: str = "unknown", user_id: str | None = None) -> None:
        self.stats.connection_closed(kind)
        if user_id is not None:
            self.user_caps.release_connection(user_id)

    def _release_slot(self, transport: Transport, user_id: str) -> None:
        """A replaced transport's slot back at once (its ``end_transport`` gives none)."""
        if id(transport) not in self._released:
            self._released[id(transport)] = transport
            self.close_connection(transport.kind, user_id)

    def open_body(self, user_id: str) -> None:
        """Count a POST body being read (maxConnectionsPerUser a user), or raise
        USER_CONNECTION_LIMIT; the caller owes close_body."""
        try:
            self.user_caps.take_body(user_id)
        except UserConnectionLimit as exc:
            self.stats.count(self.stats.connections_refused, exc.code)
            raise

    def close_body(self, user_id: str) -> None:
        self.user_caps.release_body(user_id)

    def new_session(self, user_id: str, session_id: str | None = None) -> LiveSession:
        """A new session of the user's, named ``session_id`` (an AG-UI thread) or random."""
        live = self.adopt(ProtocolSession(session_id or ids.new_session_id(), user_id,
                                          self.settings, now_ms(), self.stats.traffic))
        self.hub.add(live)
        return live

    def adopt(self, core: ProtocolSession) -> LiveSession:
        """A live session around a protocol session (new, or moved here from another node)."""
        core.traffic = self.stats.traffic  # this node counts what it carries
        self.budget.bind(core)  # its texts, calls and runs charged to its user as they come
        self.wheel.add(live := LiveSession(core), 0)  # visited at the next tick
        return live

    def tool_runner(self, live: LiveSession) -> SessionToolRunner:
        """The session's tool runner, built on its first call (idle sessions have none)."""
        if live.runner is None:
            live.runner = self._new_runner(live)
        return live.runner

    def _new_runner(self, live: LiveSession) -> SessionToolRunner:
        sink = CallSink(live.id, self.tool_context,
                        Bell(partial(self.settle_calls, live), apart=True))
        return SessionToolRunner(sink, self.config.max_concurrent_runs,
                                 self.config.tool_queue_size, self.config.tool_timeout,
                                 on_finish=self.stats.tools.finished, tally=self.stats.tools)

    def settle_calls(self, live: LiveSession) -> None:
        """Apply what the session's tool runner reported (its bell rang: in a greenlet of
        its own; or the session layer just called it), in order, one greenlet at a time:
        each report to the session, its events acted on, the waiting ``on_done`` told,
        the tool's exception signalled."""
        runner = live.runner
        if runner is None or runner.pulling:
            return  # (the greenlet pulling takes what came meanwhile too)
        runner.pulling = True
        try:
            while runner.reports:
                for report in runner.take_reports():
                    self.dispatcher.apply_report(live, report)
        finally:
            runner.pulling = False

    def find_session(self, session_id: str | None, user_id: str, *,
                     claim: bool = True, last_seq: int | None = None) -> LiveSession:
        """The user's own session, or SESSION_NOT_FOUND (also for another user's id). In a
        cluster, ``claim`` moves one another process holds here (a resume from
        ``last_seq``); without it only this process's sessions are found."""
        live = self.hub.get(session_id) if session_id else None
        if live is None and session_id and claim:
            live = self.hub.claim(session_id, user_id, last_seq)
        if live is None or live.user_id != user_id or live.core.closed:
            raise SessionNotFound(f"no session {session_id!r} for this user")
        return live

    def held_session(self, session_id: str, user_id: str) -> LiveSession | None:
        """The user's session if held here, else None (SESSION_NOT_FOUND: another's)."""
        if self.hub.get(session_id) is None:
            return None
        return self.find_session(session_id, user_id, claim=False)

    def session_for_body(self, session_id: str, user_id: str,
                         body: bytes) -> LiveSession | None:
        """For a body whose session is not held here: None once its holder took the body
        (errors go downstream there), else the session, taken over, or SESSION_NOT_FOUND."""
        if self.hub.route(session_id, Upstream(user_id, body)):
            return None
        return self.find_session(session_id, user_id)

    def post_body(self, session_id: str, user_id: str, body: bytes,
                  held: LiveSession | None) -> int:
        """A body posted for a session (``held``: the session if held here before the body
        was read), to it wherever it lives; how many messages it carried. InvalidMessage
        for a body not JSON at all (reported downstream too), SESSION_NOT_FOUND."""
        if held is not None and self.hub.get(session_id) is not held:
            held = None  # it moved to another node while the body was read: follow it
        live = held if held is not None else self.session_for_body(session_id, user_id, body)
        if live is None:  # another node holds the session and processes the body
            return self.count_body(body)
        accepted = self.receive_body(live, body)
        if live.link is not None:  # clustered: Redis has the state before the 202
            live.link.persist(live)
        return accepted

    def open_transport(self, live: LiveSession, transport: Transport,
                       last_seq: int | None) -> None:
        """An admitted transport starts serving its session: attach it, log it open."""
        self.attach(live, transport, last_seq)
        if self.config.enable_logging:
            access_log.info("%s open session=%s user=%s%s", transport.kind, live.id,
                            live.user_id, "" if last_seq is None
                            else f" resume last_seq={last_seq}")

    def end_transport(self, live: LiveSession, transport: Transport,
                      attached: bool = True) -> None:
        """An admitted transport is done, however it ended: detach it (if attached), give
        its connection slot back (``admit`` counted it) and log it closed."""
        try:
            if attached:
                self.detach(live, transport)
        finally:
            if self._released.pop(id(transport), None) is None:
                self.close_connection(transport.kind, live.user_id)
            if self.config.enable_logging:
                access_log.info("%s closed session=%s", transport.kind, live.id)

    def attach(self, live: LiveSession, transport: Transport,
               last_seq: int | None = None) -> None:
        """Give the session a live transport; an older one is closed (4002)."""
        old = live.transport
        if old is not None and old is not transport:
            live.transport = None
            # it stops counting now, not when its close handshake ends (up to its
            # CLOSE_TIMEOUT later): resumes in a loop kept every replaced one counted
            self._release_slot(old, live.user_id)
            old.close(CloseCode.SUPERSEDED, "superseded by a resumed connection")
        live.core.attach(now_ms(), last_seq)
        live.transport = transport
        self.kept.connected(live)
        self.hub.changed(live)
        self._emit(signals.connect, session_id=live.id)
        self.settle(live)

    def detach(self, live: LiveSession, transport: Transport) -> None:
        """The transport is gone; the session is kept for resume (replayWindowTime)."""
        if live.transport is not transport:
            return
        live.transport = None
        live.core.detach(now_ms())
        self.hub.changed(live)
        self.kept.keep(live)
        self._emit(signals.disconnect, session_id=live.id)

    # -- upstream --------------------------------------------------------------------

    def receive_plain(self, live: LiveSession, raw: bytes | str) -> None:
        """One upstream message: the core takes it, the writer's bell rings, its events
        go to the dispatcher, the time it took is recorded. ``receive``'s definition."""
        started = now_ms()
        core = live.core
        core.receive(raw, started)
        live.notify()
        if core.has_events():
            self._dispatch(live, core.take_events())
            live.notify()  # what the events made (a refused call's TOOL_DONE) goes too
        finished = now_ms()
        self.stats.record(finished, finished - started)

    def receive_fast(self, live: LiveSession, raw: bytes | str) -> None:
        """``receive_plain`` with the clock read inline (``clock.now_ms`` is
        ``now_ns() // 1_000_000``) and the events' list read: calls cost more."""
        started = now_ns() // 1_000_000
        core = live.core
        core.receive(raw, started)
        live.notify()
        if core.events:  # has_events(), read directly
            self._dispatch(live, core.take_events())
            live.notify()
        finished = now_ns() // 1_000_000
        self.stats.record(finished, finished - started)

    #: the swap point: every message takes it (tests/engine/test_engine.py TestReceive
    #: runs the same cases over both)
    receive = receive_fast

    def receive_binary(self, live: LiveSession, data: bytes) -> None:
        self._emit(signals.binary, session_id=live.id, data=data)

    def reject(self, live: LiveSession, exc: ProtoError) -> None:
        """A transport's problem with one message: an ERROR, counted as one received."""
        started = now_ms()
        live.core.reject(exc)
        self.settle(live)
        finished = now_ms()
        self.stats.record(finished, finished - started)

    def receive_body(self, live: LiveSession, body: bytes) -> int:
        """Hand every message of a posted body to the session (its rules; errors go
        downstream); returns how many. A body of which no line is JSON at all is reported
        like a non-JSON WebSocket frame, then raised as InvalidMessage (the HTTP 400).
        ``BODY_SLICE`` messages (or ``turns.SLICE`` of time) at a time, a turn for the
        other greenlets between slices (docs/RELIABILITY.md, "one body of tiny messages")."""
        # a decoded part: ``receive``'s steps for a message already parsed, with what
        # they look up bound once per body
        core, notify, record, dispatch = live.core, live.notify, self.stats.record, \
            self._dispatch
        count = handled = 0
        pacer, user = self.pacer, live.user_id
        pacer.pause(user)
        sliced = finished = now_ms()  # finished: the last message's end (no clock read
        # of its own: a slice's time is told from the messages' own timing)
        try:
            for part in iter_body(body):
                if part is TURN or handled >= BODY_SLICE or finished - sliced >= SLICE_MS:
                    pacer.took(user, (now_ms() - sliced) / 1000)  # a turn, or a pause
                    handled, sliced = 0, now_ms()
                    finished = sliced
                    if part is TURN:
                        continue
                count += 1
                handled += 1
                if is_raw(part):
                    self.receive(live, part[0])
                    continue
                started = now_ms()
                core.receive_decoded(part[0], part[1], started)
                notify()
                if core.has_events():
                    dispatch(live, core.take_events())
                    notify()
                finished = now_ms()
                record(finished, finished - started)
        except InvalidMessage:  # raised before any part: the body is not JSON at all
            self.receive(live, body)
            raise
        return count

    def receive_forwarded(self, live: LiveSession, body: bytes) -> None:
        """A body another node took for a session here (its errors went downstream)."""
        with suppress(ProtoError):
            self.receive_body(live, body)

    def count_body(self, body: bytes) -> int:
        """How many messages a body carries, in ``receive_body``'s slices (or InvalidMessage)."""
        count = 0
        for part in iter_body(body):
            if part is TURN or count % BODY_SLICE == BODY_SLICE - 1:
                give_turn()
            if part is not TURN:
                count += 1
        return count

    def close_transport(self, live: LiveSession, code: int, reason: str) -> None:
        """Close the session's transport (if any) with ``code``; the session stays."""
        transport = live.transport
        if transport is not None:
            self.settle(live)
            transport.close(code, reason)
            self.detach(live, transport)

    def _drop_for_memory(self, live: LiveSession, why: str) -> None:
        """End a session the memory budget cannot keep: a live one is told (ERROR
        MESSAGE_TOO_LARGE, then 1009); either way it is gone, as if it had expired."""
        log.warning("session %s of user %s: %s", live.id, live.user_id, why)
        if live.transport is not None:  # the port's too_large(..., close=True)
            self.reject(live, MessageTooLarge(f"the session was closed: {why}"))
            self.close_transport(live, CloseCode.TOO_LARGE, "message too large")
        live.core.close()
        self._expire(live)

    def _expire(self, live: LiveSession) -> None:
        self.kept.forget(live)
        self.budget.forget(live)
        self.wheel.discard(live)  # now, not at its slot: it would keep the whole session
        self.hub.remove(live.id)
        if live.runner is not None:
            live.runner.cancel_all(pulled=True)
            self.settle_calls(live)
        if live.core.closed:  # (always, here) its memory goes now, as the budget's did,
            live.core.outbound.let_go()  # after its calls settled: nothing of theirs stays

    # -- the application's operations (ProtoServer's public API) ---------------------

    def call_tool(self, live: LiveSession, name: str, args: Any, call_id: str,
                  run_id: str | None,
                  on_done: Callable[[ToolExecution, ProtoError | None], None]) -> None:
        """Start a call of the application's own agent in the session (``call_tool``):
        the contract's errors are raised before anything is sent; ``on_done`` hears the
        end."""
        tool = self.tools.get(name)
        check_call(tool, name, args)
        assert tool is not None
        if tool.execute is None:
            raise ValueError(f"tool {name!r} has no execute function to call")
        live.core.work.open_call(call_id, run_id, args)
        self.tool_runner(live).submit(ToolExecution(call_id, tool.name, args, run_id=run_id,
                                         on_done=on_done), tool, pulled=True)
        self.settle_calls(live)
        self.settle(live)

    def settle(self, live: LiveSession) -> None:
        """After an operation on the session's core: act on its events, wake its writer."""
        self.dispatcher.drain(live)
        live.notify()

    def drain(self, live: LiveSession) -> None:
        """Act on the events the session's core buffered, if any."""
        if live.core.has_events():
            self._dispatch(live, live.core.take_events())

    def deliver(self, session_id: str, op: Operation) -> bool:
        """Apply ``op`` to a session wherever it lives (SessionNotFound if none), then
        act on its events here."""
        result = self.hub.deliver(session_id, op)
        live = self.hub.get(session_id)
        if live is not None:
            self.drain(live)
        return result

    def broadcast(self, out: Any) -> int:
        """Send to every connected session (``hub.broadcast``), then act on the events."""
        reached = self.hub.broadcast(out)
        for live in self.hub.sessions():
            self.drain(live)
        return reached

    def tools_busy(self) -> bool:
        """Whether a tool call runs or waits in any session here (counted)."""
        return bool(self.stats.tools.running or self.stats.tools.queued)

    def close_transports(self, code: int, reason: str) -> None:
        """Close every live transport; the sessions stay for resume."""
        for live in self.hub.sessions():
            if live.transport is not None:
                self.close_transport(live, code, reason)

    def shutdown_sessions(self) -> list[LiveSession]:
        """Stopping: cancel tools, close every transport (1001); the sessions closing."""
        self.shutting_down = True
        closing = []
        for live in self.hub.sessions():
            if live.runner is not None:
                live.runner.cancel_all(pulled=True)
                self.settle_calls(live)
            transport = live.transport
            if transport is not None:
                transport.close(CloseCode.GOING_AWAY, "server stopping")
                closing.append(live)
            self.hub.remove(live.id, keep=True)
        return closing

    # -- timers ----------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Start the ticker (``ticker.py``) and the hub in the serving hub, once."""
        if self._ticker.start():
            self.hub.start()

    def tick(self) -> None:
        now = now_ms()
        self.stats.sample(now)
        self.kept.prune(now)
        self.budget.review_due(now, self.hub.sessions)  # the degrade actions (budget.py)
        self.wheel.turn(now)  # only the sessions due: PING, timeout, expiry (wheel.py)
        self.stats.held = held_of(self.hub.sessions())  # what /metrics reads: walks no one

    def stop_timers(self) -> None:
        self._ticker.stop()
        self.hub.stop()
