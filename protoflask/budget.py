"""maxUserBytes and memoryCeiling: what sessions make the worker hold, per user and in
all, and what the worker does when that is too much (docs/PROTOCOL.md §1.4).

A session holds its replay window, its unsent downstream bytes (queued, being resent or
written) and its open texts, each counted by what it costs in memory: a text's parts
by ``sys.getsizeof`` (a str holding one character beyond Latin-1 costs 2 or 4 bytes a
character, not its UTF-8 length). The heartbeat's tick reviews every session once a
tick (it walks them anyway), so the cost of a review is a few attribute reads a session
and reading the totals costs nothing:

* a user over ``maxUserBytes`` (all their sessions, live and kept) loses their oldest
  kept sessions first, then their heaviest session is closed (an ERROR
  MESSAGE_TOO_LARGE, then 1009), and while over it their new sessions are refused (503
  USER_CONNECTION_LIMIT);
* all sessions over ``memoryCeiling``: new sessions are refused (503 MAX_CONNECTIONS),
  the oldest kept sessions of anyone are dropped, then the heaviest session is closed.

Tool calls' parameters and results are not counted (they are bounded per session by
maxConcurrentRuns + toolQueueSize calls of maxMessageSize each).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from .core.errors import MaxConnections, UserConnectionLimit
from .live import LiveSession
from .kept import KeptSessions

log = logging.getLogger("protoflask")


def held_bytes(live: LiveSession) -> int:
    """What the session makes the worker hold, in bytes of memory (see the module doc)."""
    core = live.core
    outbound = core.outbound
    held = outbound.replay.nbytes + outbound.unsent_bytes
    for text in core.texts.values():
        held += text.memory
    return held


class MemoryBudget:
    def __init__(self, user_budget: int, ceiling: int, kept: KeptSessions,
                 drop: Callable[[LiveSession, str], None]) -> None:
        self.user_budget = user_budget  # 0: none
        self.ceiling = ceiling  # 0: none
        self.kept = kept
        self.drop = drop  # ends a session (closing its transport, if any), saying why
        #: after the last review: bytes held by all sessions, and by each user over budget
        self.total = 0
        self.over: dict[str, int] = {}

    def admit(self, user_id: str) -> None:
        """Refuse a new session while the worker or the user is over budget."""
        if self.ceiling and self.total > self.ceiling:
            raise MaxConnections(f"the sessions hold {self.total} bytes "
                                 f"(memoryCeiling {self.ceiling})")
        held = self.over.get(user_id)
        if held is not None:
            raise UserConnectionLimit(f"this user's sessions hold {held} bytes "
                                      f"(maxUserBytes {self.user_budget})")

    def review(self, sessions: Iterable[LiveSession]) -> None:
        """Count every session, then bring users and the worker back under budget."""
        by_user: dict[str, int] = {}
        weights: dict[str, int] = {}
        total = 0
        for live in sessions:
            if live.core.closed:
                continue
            held = weights[live.id] = held_bytes(live)
            by_user[live.user_id] = by_user.get(live.user_id, 0) + held
            total += held
        self.over = {}
        if self.user_budget:
            for user, held in by_user.items():
                if held > self.user_budget:
                    total -= held
                    held = self._shed(user, held, self.user_budget, weights, "maxUserBytes")
                    total += held
                    if held > self.user_budget:
                        self.over[user] = held
        if self.ceiling and total > self.ceiling:
            total = self._shed(None, total, self.ceiling, weights, "memoryCeiling")
        self.total = total

    def _shed(self, user: str | None, held: int, budget: int, weights: dict[str, int],
              why: str) -> int:
        """Drop kept sessions (of ``user``, or anyone's), oldest first, then the heaviest
        session, until ``held`` is within ``budget``; returns what is still held."""
        for live in self.kept.oldest(user):
            if held <= budget:
                return held
            held -= weights.pop(live.id, 0)
            self.drop(live, f"{why}: dropping the oldest kept session")
        if held > budget and weights:
            sessions = self.kept.hub.sessions()
            mine = [s for s in sessions if s.id in weights
                    and (user is None or s.user_id == user) and not s.core.closed]
            if mine:
                heaviest = max(mine, key=lambda s: weights[s.id])
                held -= weights.pop(heaviest.id)
                self.drop(heaviest, f"{why}: closing the heaviest session")
        return held
