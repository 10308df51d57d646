"""The session's state beside its transition table (core/state.py's BESIDE and
RESETS): each transition puts back what the table says, and nothing it lists is missing
from the session."""

from __future__ import annotations

from typing import Any

import pytest

from protoflask.core.state import BESIDE, RESETS, SessionState, Transition

from ._support import make_session



def dirty(start: Any) -> Any:
    """A value other than ``start`` of its kind."""
    if start is None:
        return "hb-pending"
    if isinstance(start, bool):
        return not start
    return start + 123


def _owner(session: Any, name: str) -> tuple[Any, str]:
    part, _, flag = name.partition(".")  # "part.flag": a flag of a part the session has
    return getattr(session, part), flag


def test_every_flag_beside_the_table_is_the_sessions() -> None:
    session = make_session()
    for name in BESIDE:
        owner, attr = _owner(session, name)
        assert hasattr(owner, attr), name
    for steps in RESETS.values():
        assert all(name in BESIDE for name, _ in steps)
    # the flags the lifecycle left out before they were listed here
    assert {"rate.flooding", "heartbeat.nonce", "outbound._pause_armed",
            "outbound._overflowed"} <= set(BESIDE)


@pytest.mark.parametrize("transition", [Transition.ATTACH, Transition.DETACH])
def test_a_transition_resets_what_the_table_says(transition: Transition) -> None:
    session = make_session()  # attached
    if transition is Transition.ATTACH:
        session.detach(0)
    for name, start in RESETS[transition]:
        owner, attr = _owner(session, name)
        setattr(owner, attr, dirty(start))
    if transition is Transition.ATTACH:
        session.attach(0)
        assert session.state is SessionState.GREETING
    else:
        session.detach(0)
    for name, start in RESETS[transition]:
        owner, attr = _owner(session, name)
        assert getattr(owner, attr) == start, name
