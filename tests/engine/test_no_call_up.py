"""What a lower layer used to call up into the session layer or a transport for, and now
rings or reads below (docs/ARCHITECTURE.md, "Calls back up, counted"): a superseded
port's writer is closed in a greenlet of its own, not on the stack of the port that
took over; a cluster giving back a moved session's memory charge rings the engine
(``bell.soon``); a cluster's beat reads this node's figures from ``stats.py``. Each
test fails on the call it replaced (the close and the charge ran on the caller's stack)."""

from __future__ import annotations

import gevent
from gevent import getcurrent

from protoflask.core.errors import CloseCode
from protoflask.port import Limits, SessionPort

from .test_engine import Harness

LIMITS = Limits(65536, 10, 25_000)


class Writer:
    """A writer that records on which greenlet, and with what, it was closed."""

    reader = None

    def __init__(self, kind: str = "websocket") -> None:
        self.kind = kind
        self.closed: list[tuple[int, object]] = []

    def wake(self) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, getcurrent()))


def test_a_superseded_writer_is_closed_apart_and_a_closed_one_at_once() -> None:
    h = Harness()
    live = h.engine.new_session("u1")
    old_writer, new_writer = Writer(), Writer()
    old = SessionPort(h.engine, live, None, "websocket", LIMITS)
    old.attach(old_writer)
    SessionPort(h.engine, live, 0, "websocket", LIMITS).attach(new_writer)
    assert old_writer.closed == []  # not on the stack of the port taking over
    gevent.sleep(0)
    ((code, where),) = old_writer.closed
    assert code == CloseCode.SUPERSEDED and where is not getcurrent()
    # a transport closed while it serves (a 1009, a drain) writes what is pending first,
    # on the closing stack: the session detaches right after
    h.engine.close_transport(live, CloseCode.TOO_LARGE, "message too large")
    assert new_writer.closed == [(CloseCode.TOO_LARGE, getcurrent())]
    assert live.transport is None


def test_a_moved_sessions_charge_is_rung_back_and_the_figures_read_below() -> None:
    h = Harness(maxUserBytes=10_000_000)
    live = h.engine.new_session("u1")
    live.core.send_text("x" * 100_000)  # charged to u1's window
    account = h.engine.budget.accounts["u1"]
    charged = account.held + account.window
    assert charged >= 100_000
    host = h.hub.host
    assert host is not None
    host.released(live)  # what a cluster calls when the session moved away
    assert account.held + account.window == charged  # rung, not run on this stack
    gevent.sleep(0)
    assert account.held + account.window < charged - 90_000
    assert host.local_stats == h.engine.stats.figures  # stats.py's, not the engine's
