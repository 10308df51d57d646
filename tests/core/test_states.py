"""The session's lifecycle (session.py's state table): what attach, detach, HELLO and
close do from each state, and the read-only views callers use."""

from __future__ import annotations

import pytest

from protoflask.core.session import TRANSITIONS, ProtocolSession, SessionState, Transition

from ._support import Client, make_session, session_settings, tick_events


def test_every_state_answers_every_transition() -> None:
    for state in SessionState:
        assert set(TRANSITIONS[state]) == set(Transition)


def test_closed_is_final() -> None:
    assert set(TRANSITIONS[SessionState.CLOSED].values()) == {SessionState.CLOSED}


@pytest.mark.parametrize("state, connected, greeted, closed", [
    (SessionState.NEW, False, False, False),
    (SessionState.GREETING, True, False, False),
    (SessionState.OPEN, True, True, False),
    (SessionState.DETACHED, False, True, False),
    (SessionState.CLOSED, False, False, True),
])
def test_views_follow_the_state(state: SessionState, connected: bool, greeted: bool,
                                closed: bool) -> None:
    s = make_session(attach=False)
    s._state = state  # the views alone, whatever led here
    assert (s.connected, s.handshake_completed, s.closed) == (connected, greeted, closed)


def test_a_session_goes_from_new_to_open_to_detached_and_back() -> None:
    s = make_session(attach=False)
    assert s.state is SessionState.NEW
    s.attach(0)
    assert s.state is SessionState.GREETING
    Client(s).handshake()
    assert s.state is SessionState.OPEN
    s.detach(10)
    assert s.state is SessionState.DETACHED
    s.attach(20)
    assert s.state is SessionState.OPEN


def test_a_hello_without_a_transport_completes_the_handshake() -> None:
    """An HTTP client may POST its HELLO before its event stream is attached."""
    s = make_session(attach=False)
    Client(s).send("HELLO", {"proto_version": "1.1.2", "accept_major": [1],
                             "accept_events": []})
    assert s.state is SessionState.DETACHED and s.handshake_completed and not s.connected


def test_a_detached_session_expires_into_closed_and_stays_there() -> None:
    s = ProtocolSession("S", "u", session_settings(replay_window_time=100), now=0,
                        greeted=True)
    assert s.state is SessionState.DETACHED
    tick_events(s, 100)
    assert s.state is SessionState.CLOSED
    s.attach(200)
    assert s.state is SessionState.CLOSED and not s.connected


def test_close_refuses_later_sends() -> None:
    s = make_session()
    s.close()
    assert s.closed and s.state is SessionState.CLOSED
