"""The tick's budget review (budget.py ``review_due``) walks the sessions only when a
running count is near its budget, or every FULL_EVERY_MS: a storm of small sessions far
from any budget costs the tick no walk, and what the counts missed is still recounted."""

from __future__ import annotations

from typing import Callable

from protoflask.budget import FULL_EVERY_MS
from protoflask.clock import now_ms
from protoflask.live import LiveSession

from .test_engine import Harness

KB = 1024


def counting(h: Harness) -> tuple[list[int], Callable[[], list[LiveSession]]]:
    walks = [0]

    def sessions() -> list[LiveSession]:
        walks[0] += 1
        return h.hub.sessions()
    return walks, sessions


def test_far_from_the_budget_the_tick_walks_no_one_but_every_full_period() -> None:
    h = Harness(maxUserBytes=1000 * KB)
    for i in range(5):
        h.hello(h.connect(f"u{i}")[0])
    budget = h.engine.budget
    walks, sessions = counting(h)
    now = now_ms()
    budget.review_due(now, sessions)  # the first tick: a full review
    assert walks == [1]
    for k in range(1, 10):
        budget.review_due(now + k * 100, sessions)
    assert walks == [1]
    budget.review_due(now + FULL_EVERY_MS, sessions)
    assert walks == [2]


def test_near_the_budget_every_tick_reviews_and_sheds() -> None:
    h = Harness(maxUserBytes=1000 * KB)
    live, transport = h.connect("u1")
    h.hello(live)
    budget = h.engine.budget
    walks, sessions = counting(h)
    now = now_ms()
    budget.review_due(now, sessions)
    budget.user_budget = 0  # off while the window fills past it (as test_budget does)
    live.core.send_text("x" * 1100 * KB)
    budget.user_budget = 1000 * KB
    budget.review_due(now + 100, sessions)  # the count says: near (over, here)
    assert walks == [2]
    assert h.hub.get(live.id) is None and transport.closed[-1][0] == 1009


def test_a_session_gone_without_giving_back_is_forgotten_at_the_full_review() -> None:
    h = Harness(maxUserBytes=1000 * KB)
    live, _ = h.connect("u1")
    h.hello(live)
    budget = h.engine.budget
    now = now_ms()
    budget.review_due(now, h.hub.sessions)
    assert "u1" in budget.accounts
    h.hub.remove(live.id)  # taken over by another node: no ``forget``
    budget.review_due(now + 100, h.hub.sessions)
    assert "u1" in budget.accounts  # far from the budget: not yet
    budget.review_due(now + FULL_EVERY_MS, h.hub.sessions)
    assert "u1" not in budget.accounts and budget.total == 0
