"""The session's lifecycle as data (h11's ``_state.py`` style): its states, the
transitions between them as a table, and beside the table the rest of the session's
state with the transitions that reset it. ``core/session.py`` runs it."""

from __future__ import annotations

import enum
from typing import Any


class SessionState(enum.Enum):
    NEW = "new"  # no transport and no HELLO yet
    GREETING = "greeting"  # a transport is attached; waiting for HELLO
    OPEN = "open"  # attached, handshake completed
    DETACHED = "detached"  # handshake completed, no transport: kept for a resume
    CLOSED = "closed"  # expired or closed for good: no more sends

    # Members are singletons: hash them by identity, in C (Enum's own __hash__ is Python
    # code, and the state is looked up in a set for every message).
    __hash__ = object.__hash__


class Transition(enum.Enum):
    ATTACH = "attach"
    DETACH = "detach"
    HELLO = "hello"
    CLOSE = "close"

    __hash__ = object.__hash__  # as SessionState's


_S = SessionState
_COLUMNS = (Transition.ATTACH, Transition.DETACH, Transition.HELLO, Transition.CLOSE)
_TABLE = (
    # state       attach        detach        HELLO         close
    (_S.NEW,      _S.GREETING,  _S.NEW,       _S.DETACHED,  _S.CLOSED),
    (_S.GREETING, _S.GREETING,  _S.NEW,       _S.OPEN,      _S.CLOSED),
    (_S.OPEN,     _S.OPEN,      _S.DETACHED,  _S.OPEN,      _S.CLOSED),
    (_S.DETACHED, _S.OPEN,      _S.DETACHED,  _S.DETACHED,  _S.CLOSED),
    (_S.CLOSED,   _S.CLOSED,    _S.CLOSED,    _S.CLOSED,    _S.CLOSED),
)
#: state -> transition -> next state
TRANSITIONS: dict[SessionState, dict[Transition, SessionState]] = {
    row[0]: dict(zip(_COLUMNS, row[1:], strict=True)) for row in _TABLE}
#: The rest of the session's state, listed beside the table (as h11's ``_state.py``
#: lists its flags): each flag that lives outside the lifecycle above and what it means
#: (its start value in brackets); ``RESETS``: the transitions that put one back to its
#: start value, which ``ProtocolSession._to`` applies (tests/core/test_session_state.py).
#: "part.name" names a flag of one of the parts the session composes: its rate limiter
#: (``rate``, ``core/ratelimit.py``), its heartbeat (``heartbeat``, ``core/heartbeat.py``),
#: its outbound queue (``outbound``, ``core/outbound.py``).
BESIDE: dict[str, str] = {
    "rate.flooding": "closed for flooding: later messages are dropped unread (False)",
    "heartbeat.nonce": "the heartbeat PING waiting for its PONG (None)",
    "outbound._overflowed": "SlowConsumer reported for this connection (False)",
    "outbound._pause_armed": "back-pressure may pause USER: data was queued since the "
                             "last resume (True)",
    "outbound.in_flight": "bytes the transport is writing (0)",
}
#: transition -> (state, start value) reset when it happens
RESETS: dict[Transition, tuple[tuple[str, Any], ...]] = {
    Transition.ATTACH: (("rate.flooding", False), ("heartbeat.nonce", None),
                        ("outbound._overflowed", False), ("outbound.in_flight", 0)),
    Transition.DETACH: (("heartbeat.nonce", None),),
    Transition.HELLO: (), Transition.CLOSE: (),
}
def _split(name: str) -> tuple[str, str]:
    part, _, flag = name.partition(".")
    return part, flag


#: transition -> (the part's attribute name on the session, the flag, its start value)
RESET_STEPS: dict[Transition, tuple[tuple[str, str, Any], ...]] = {
    t: tuple((*_split(name), value) for name, value in steps) for t, steps in RESETS.items()}
