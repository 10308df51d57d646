"""The session port: the one object a transport holds, and the gate that gives one out.

A transport (``transports/``: WebSocket, SSE, the NDJSON stream) only frames bytes. What
it asks of the session layer goes through a handful of verbs on its ``SessionPort``:

- upstream: ``receive`` (one message's bytes), ``receive_binary``, ``too_large`` (a
  message too large to take whole); the POST body goes through ``Ports.answer_post``;
- downstream: ``take`` (what is ready to write now; the port wakes its writer when
  more is), ``take_final`` (everything, for a closing transport), ``in_flight`` and
  ``written`` (what the transport is writing, for back-pressure);
- its life: ``attach`` (it serves the session from now on) and ``end``.

After each upstream call the session layer drains the events the call caused
(``Engine.receive``: the core's events, to the dispatcher) and wakes the writer: no
lower layer calls up into it. The port is the session's ``Transport`` as the registry
sees it (``wake``, ``close``), and forwards both to its writer.

Every transport writes the same way, on one node and on Redis: ``take`` hands what the
core stamped to the cluster's write-behind stage first (``LiveSession.take_writable_then``:
the journal), returns nothing meanwhile, and wakes the writer once the stage has it; the
next ``take`` returns that batch. While a batch is in the stage the transport writes
nothing else (``holding``), so a close frame or a later batch never overtakes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol

import gevent.event
import orjson

from .clock import now_ms, now_ns
from .core.errors import (
    CloseCode, InvalidMessage, MessageTooLarge, ProtoError, RequestTimeout,
)
from .live import LiveSession

if TYPE_CHECKING:
    from .config import ServerConfig
    from .engine import Engine
    from .turns import Pacer

Ready = list[tuple[int, bytes]]

# where a port's batch is in the write-behind stage
_IDLE, _HANDING, _HELD = 0, 1, 2
#: s a closing transport waits for a batch in the stage (the journal gives up on Redis
#: after its WAIT_LIMIT, 2 s, and releases it either way)
SETTLE_WAIT = 5.0


def _nothing() -> None:
    return None


class Writer(Protocol):
    """What a transport offers its port."""

    kind: str  # "websocket" | "sse" | "stream"

    def wake(self) -> None:
        """The session has messages to write: write them soon, never blocking the caller."""

    def close(self, code: int, reason: str) -> None:
        """Write what is pending, then close with ``code`` (WebSocket) or end the stream."""


@dataclass(frozen=True)
class Admission:
    """A connection request that passed auth, the owner check and the connection limit.

    ``resume`` is the user's existing session when the request named one."""

    user_id: str
    resume: LiveSession | None
    last_seq: int | None


@dataclass(frozen=True)
class Limits:
    """The configuration a transport frames by."""

    max_message_size: int
    body_timeout: int | None  # s
    heartbeat_interval: int  # ms

    @classmethod
    def of(cls, config: "ServerConfig") -> "Limits":
        return cls(config.max_message_size, config.body_timeout, config.heartbeat_interval)


class PostAnswer(NamedTuple):
    """What a session POST is answered with, before any web framework shapes it."""

    status: int
    body: dict[str, Any]
    #: the rest of the body is not worth waiting for: the connection is closed after it
    close: bool = False
    #: seconds for a Retry-After header (a 503 the client should retry)
    retry_after: int | None = None

    def encoded(self) -> bytes:
        return orjson.dumps(self.body)


class SessionPort:
    """One transport's hold on one session (see the module doc)."""

    __slots__ = ("engine", "live", "kind", "last_seq", "limits", "receive", "wake",
                 "translate", "_writer", "_stage", "_shared", "_settled")

    def __init__(self, engine: "Engine", live: LiveSession, last_seq: int | None,
                 kind: str, limits: Limits | None = None) -> None:
        self.engine = engine
        self.live = live
        self.kind = kind
        self.last_seq = last_seq
        self.limits = limits if limits is not None else Limits.of(engine.config)
        #: ``receive(data)``: one upstream message (bound once: every message calls it)
        self.receive: Callable[[bytes | str], None] = partial(engine.receive, live)
        #: ``wake()``: the session has messages to write (Transport): the writer's own
        #: wake once attached, called as it is (every message the session sends calls it)
        self.wake: Callable[[], None] = _nothing
        #: rewrites what the session sends before the transport frames it (the AG-UI
        #: WebSocket extension's translator, agui/socket.py), or None
        self.translate: Callable[[Ready], Ready] | None = None
        self._writer: Writer | None = None
        self._stage = _IDLE
        self._shared: Ready | None = None  # a batch the stage released, for the next take
        self._settled: gevent.event.Event | None = None  # a closing writer waits on it

    @property
    def id(self) -> str:
        return self.live.core.id

    @property
    def user_id(self) -> str:
        return self.live.core.user_id

    @property
    def pacer(self) -> "Pacer":
        """The worker's pacing of costly turns (turns.Pacer): a reader waits out what its
        user owes before a read and reports each costly turn."""
        return self.engine.pacer

    # -- its life --------------------------------------------------------------------------

    def attach(self, writer: Writer) -> None:
        """The transport serves the session from now on (an older one is closed, 4002)."""
        self._writer = writer
        self.wake = writer.wake
        self.engine.open_transport(self.live, self, self.last_seq)

    def end(self) -> None:
        """The transport is done, however it ended: detach (if it attached) and give its
        connection slot back. Once."""
        self.engine.end_transport(self.live, self, attached=self._writer is not None)

    @property
    def writer(self) -> "Writer | None":
        """The transport connection this port writes through (None before ``attach``):
        what ``ProtoServer.get_session`` hands out as ``ws``/``sseResponse``/``httpResponse``."""
        return self._writer

    @property
    def attached(self) -> bool:
        """Whether this transport still serves the session (not superseded, not closed)."""
        return self.live.transport is self

    # -- Transport: what the registry and the session layer call ---------------------------

    def close(self, code: int, reason: str) -> None:
        if self._writer is not None:
            self._writer.close(code, reason)

    # -- upstream --------------------------------------------------------------------------

    def receive_binary(self, data: bytes) -> None:
        self.engine.receive_binary(self.live, data)

    def too_large(self, exc: MessageTooLarge, *, close: bool = False) -> None:
        """An upstream message too large for the transport to take whole (a WebSocket
        message, an NDJSON line, a POST body): the core's MESSAGE_TOO_LARGE, reported
        in-protocol; with ``close``, the transport is then closed with 1009 as the core
        closes one for an oversized message it read itself."""
        self.engine.reject(self.live, exc)
        if close:
            self.engine.close_transport(self.live, CloseCode.TOO_LARGE, "message too large")

    # -- downstream ------------------------------------------------------------------------

    def has_writable(self) -> bool:
        return self._shared is not None or self.live.has_writable()

    @property
    def holding(self) -> bool:
        """A batch is in the write-behind stage: write nothing until it comes back."""
        return self._stage == _HELD

    def take(self, fresh: bool = True) -> Ready:
        """What is ready to write now: a batch the stage released, else (with ``fresh``,
        while attached) what the core has, handed to the stage first when clustered.
        Empty while the stage holds a batch: the writer is woken once it is released."""
        shared = self._shared
        if shared is not None:
            self._shared = None
            return self._translated(shared)
        live = self.live
        if self._stage or not fresh or live.transport is not self or not live.has_writable():
            return []
        now = now_ns() // 1_000_000  # now_ms(), inline: once per write
        if live.link is None:  # one process: no stage
            ready = live.core.take_writable(now)
            return self._translated(ready)
        self._stage = _HANDING
        taken = live.take_writable_then(now, self._released)
        if taken is not None:  # not journaled: written now
            self._stage = _IDLE
            return self._translated(taken)
        if self._stage == _HANDING:  # the stage has it; _released wakes the writer
            self._stage = _HELD
            return []
        shared, self._shared = self._shared, None  # released at once (a paused journal)
        if not shared:
            return []
        return self._translated(shared)

    def _translated(self, ready: Ready) -> Ready:
        """``ready`` as the transport is to frame it (``translate``, when set, on a batch)."""
        return ready if self.translate is None or not ready else self.translate(ready)

    def _released(self, ready: Ready) -> None:
        """The stage has the batch (``ready``; [] when the session moved meanwhile): the
        next ``take`` returns it. Runs in the journal's greenlet or the loop's: never
        blocks."""
        held = self._stage == _HELD
        self._stage = _IDLE
        self._shared = ready or None
        if held:
            if self._settled is not None:
                self._settled.set()
            self.wake()

    def take_final(self) -> Ready:
        """Everything left for this transport, waiting for the stage if it must: what a
        closing transport writes before its close frame or last line."""
        link = self.live.link
        if self._stage == _HELD and link is not None and not link.moved:
            # (a session that moved: its batch is not this node's to write, and the
            # journal may be the caller, dropping it: no wait)
            settled = self._settled = gevent.event.Event()
            settled.wait(SETTLE_WAIT)
            self._settled = None
        out = self.take(fresh=False)
        live = self.live
        if live.transport is self:
            more = self._translated(live.take_writable(now_ms()))
            out = out + more if out else more
        return out

    def in_flight(self, nbytes: int) -> None:
        """The transport is writing ``nbytes`` (0 once written): back-pressure reads it."""
        self.live.core.set_in_flight(nbytes)

    def written(self) -> None:
        """The transport wrote what it took without waiting (never in flight)."""
        self.live.written()


class Ports:
    """What the transports may ask of the session layer before they hold a port:
    admission, a port for an admitted request, and the session POST's answer."""

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self.limits = Limits.of(engine.config)

    def admit(self, token: str | None, session_id: str | None, last_seq: int | None,
              kind: str, ticket: str | None = None) -> Admission:
        """Let a live transport in, or raise the contract's error (401, 404, 503). Counts
        the connection: the caller owes the port's ``end`` (or ``abandon``)."""
        engine = self._engine
        try:
            user_id = engine.authenticate(token, ticket)
            resume = engine.find_session(session_id, user_id, last_seq=last_seq) \
                if session_id else None
            if resume is None:
                engine.budget.admit(user_id)
            engine.open_connection(kind, user_id, replacing=resume is not None
                                   and resume.transport is not None)
        except ProtoError as exc:
            engine.stats.count(engine.stats.connections_refused, exc.code)
            raise
        return Admission(user_id, resume, last_seq)

    def port(self, admission: Admission, kind: str) -> SessionPort:
        """The port of an admitted transport: a new session (nothing to replay), or the
        resumed one from ``last_seq`` (default: its ACK)."""
        if admission.resume is None:
            live = self._engine.new_session(admission.user_id)
            return SessionPort(self._engine, live, None, kind, self.limits)
        live, last_seq = admission.resume, admission.last_seq
        return SessionPort(self._engine, live,
                           live.core.last_ack if last_seq is None else last_seq, kind,
                           self.limits)

    def abandon(self, admission: Admission, kind: str) -> None:
        """An admitted transport that never got as far as its port: its slot back."""
        self._engine.close_connection(kind, admission.user_id)

    def answer_post(self, args: Mapping[str, str], token: str | None,
                    read: Callable[[int, int | None], bytes]) -> PostAnswer:
        """POST /proto/sse?session=<id> and the stream's follow-up POST: 202
        {"accepted": n}, the one place a session POST is answered.

        ``args`` is the query (``get`` is all it needs), ``token`` the request's, ``read``
        reads the body (``read(max_size, timeout)``). The body's messages are handed to
        the session one by one; their protocol errors go downstream. A body over
        maxMessageSize is 413 and one that is not JSON at all is 400; both are also
        reported downstream as the ERROR a WebSocket frame would get."""
        engine = self._engine
        live: LiveSession | None = None
        try:
            user_id = engine.authenticate(token, args.get("ticket"))
            session_id = args.get("session")
            if not session_id:
                raise InvalidMessage("the session query parameter is required")
            live = engine.held_session(session_id, user_id)
            engine.open_body(user_id)  # bodies being read count per user
            try:
                body = read(self.limits.max_message_size, self.limits.body_timeout)
            finally:
                engine.close_body(user_id)
            accepted = engine.post_body(session_id, user_id, body, live)
        except MessageTooLarge as exc:
            if live is not None:
                engine.reject(live, exc)
            return PostAnswer(exc.http_status, exc.to_http_body())
        except RequestTimeout as exc:  # the rest of the body is not worth waiting for
            return PostAnswer(exc.http_status, exc.to_http_body(), close=True)
        except ProtoError as exc:
            return PostAnswer(exc.http_status, exc.to_http_body(),
                              retry_after=getattr(exc, "retry_after", None))
        return PostAnswer(202, {"accepted": accepted})
