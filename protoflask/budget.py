"""maxUserBytes and memoryCeiling: what sessions make the worker hold, per user and in
all, and what the worker does when that is too much (docs/PROTOCOL.md §1.4).

A session holds its replay window and its unsent downstream bytes (queued, being resent
or written), and what its client made it hold (``core.meter``): open texts' parts,
tool calls' params until their TOOL_DONE (queued calls included) and runs' metadata,
each counted by what it costs in memory (``sys.getsizeof`` of every object: a str with
one character beyond Latin-1 costs 2 or 4 bytes a character, a list of ``{}`` 24 bytes
of memory a byte of JSON), not by its UTF-8 length.

Two checks:

* at admission, where it is cheap: every text part, tool call and run is charged to its
  user's ``Account`` (a few additions) and refused when the user or the worker would go
  over (MESSAGE_TOO_LARGE for a text part, the text discarded; MAX_RUNS_EXCEEDED for a
  call, which gets its TOOL_DONE ERROR, or a run); a new session is refused while over
  (503 USER_CONNECTION_LIMIT / MAX_CONNECTIONS). What the sessions queue downstream
  (echoes, TOOL_DONEs, the application's messages: the server's own output) is checked
  and counted as each data message is queued, with what the session's window evicted
  and its control messages added since (``Meter.queue``): a data message that would
  take the user or the worker over is dropped and reported to the application as
  OUTBOUND_QUEUE_FULL, as when the pending queue is full; control messages (ERROR,
  PONG...) are always queued;
* at the heartbeat's tick, when a running count passed half its budget (and every
  FULL_EVERY_MS anyway: ``review_due``): the accounts are counted again from the
  sessions (windows as they are, evictions included; what a session that vanished
  without giving back held is forgotten), and a user over ``maxUserBytes``
  loses their oldest kept sessions first, then their heaviest session is closed (an
  ERROR MESSAGE_TOO_LARGE, then 1009); all sessions over ``memoryCeiling``: the oldest
  kept sessions of anyone go, then the heaviest session is closed.
"""

from __future__ import annotations

import logging
from typing import Callable

from .core.errors import MaxConnections, UserConnectionLimit
from .core.meter import Meter, OverBudget
from .core.session import ProtocolSession
from .live import LiveSession
from .kept import KeptSessions

log = logging.getLogger("protoflask")

#: the tick reviews every session when a running count passes this share of its budget,
#: and at least this often (ms) whatever the counts say
NEAR = 0.5
FULL_EVERY_MS = 10_000
#: A session's slice of its user's budget (``core.meter.Lender``): counted by the
#: account when lent, then charged and given back by the session's meter without a call
#: (every tool call's params, its TOOL_DONE queued: docs/PERFORMANCE.md, "The tool row,
#: branch tool7"). A meter keeps at most CAP of it. Slices are lent only while the
#: user's and the worker's counts, the slice included, stay under LEND_UNDER of their
#: budgets, and to at most LENT_SHARE of each budget's worth of meters (CAP each): a
#: maxUserBytes under 32 * CAP (4 MiB) lends none. They are taken back at each review
#: and before any refusal they could change (``Account.settle``): nobody is refused for
#: bytes another session kept aside, and the counts never fall below what the sessions
#: hold. The lending meters are kept (``Account.lent``, ``MemoryBudget.lent``), so a
#: refusal takes back only the slices in its way, never walking the sessions: for the
#: user's maxUserBytes their own (at most LENT_SHARE * maxUserBytes / CAP), for the
#: memoryCeiling everyone's (at most LENT_SHARE * memoryCeiling / CAP, 192 at the
#: defaults). Each slice taken back was lent since by a lend of its session, so a flood
#: of refusals costs the server no more than the lends it takes back: one cheap message
#: never buys work in proportion to the sessions (docs/PERFORMANCE.md, "Slices taken
#: back by the refusal's reason, branch budget7b").
SLICE = 64 << 10
CAP = 2 * SLICE
LEND_UNDER = 0.25
LENT_SHARE = 1 / 32
#: an account's ``lent`` until it lends (a set of its own then): no object per user
#: that never borrows (tests/engine/test_session_objects.py)
NONE_LENT: set[Meter] = frozenset()  # type: ignore[assignment]


def window_bytes(live: LiveSession) -> int:
    """What the session holds for its client: its replay window and unsent bytes."""
    outbound = live.core.outbound
    return outbound.replay.nbytes + outbound.unsent_bytes


def held_bytes(live: LiveSession) -> int:
    """What the session makes the worker hold, in bytes of memory (see the module doc)."""
    return window_bytes(live) + live.core.meter.held


class Account:
    """One user's running count (``core.meter.Account``), and the worker's through it."""

    __slots__ = ("budget", "worker", "held", "window", "lent")

    def __init__(self, budget: "MemoryBudget") -> None:
        self.budget = budget
        self.worker = budget
        self.held = 0  # charged by the user's meters since the last tick, and before it
        self.window = 0  # the user's windows and unsent bytes: counted at the last tick,
        # and moved by each message their sessions queued since (evictions taken off).
        # Slices lent (``lend``) are in ``held``; a meter moves bytes of its slice to
        # its held or window bytes without telling: ``held + window`` is exact, the
        # split again after ``MemoryBudget.settle`` or a review.
        self.lent = NONE_LENT  # the user's meters holding a slice (all in the worker's
        # ``MemoryBudget.lent`` too)

    @property
    def lenders(self) -> int:
        return len(self.lent)

    def over(self, more: int = 0) -> str | None:
        """Why ``more`` bytes would take the user or the worker over, or None."""
        budget = self.budget
        if budget.user_budget and self.held + self.window + more > budget.user_budget:
            return (f"this user's sessions hold {self.held + self.window} bytes "
                    f"(maxUserBytes {budget.user_budget})")
        if budget.ceiling and budget.held + budget.window + more > budget.ceiling:
            return (f"the sessions hold {budget.held + budget.window} bytes "
                    f"(memoryCeiling {budget.ceiling})")
        return None

    def refuses(self, more: int) -> bool:
        """Whether ``more`` bytes would take the user or the worker over."""
        budget = self.budget
        return bool(
            budget.user_budget and self.held + self.window + more > budget.user_budget
            or budget.ceiling and budget.held + budget.window + more > budget.ceiling)

    def take(self, nbytes: int) -> None:
        budget = self.budget  # ``over``'s test written out (texts, runs, unlent calls)
        if budget.user_budget and self.held + self.window + nbytes > budget.user_budget \
                or budget.ceiling and budget.held + budget.window + nbytes > budget.ceiling:
            if budget.lent:  # refused, unless only slices lent were in the way
                self.settle(nbytes)
            if self.refuses(nbytes):
                raise OverBudget(self.over(nbytes))
        self.held += nbytes
        self.worker.held += nbytes
        if self.held + self.window > budget.peak:
            budget.peak = self.held + self.window

    def give(self, nbytes: int) -> None:
        self.held -= nbytes
        self.worker.held -= nbytes

    def lend(self, meter: Meter, nbytes: int) -> None:
        """``take`` for a meter whose spare is short of ``nbytes`` (``core.meter.Lender``):
        the rest counted, and a new slice with it while the budgets have room for one."""
        budget = self.budget
        if self.refuses(nbytes - meter.spare):
            if budget.lent:
                self.settle(nbytes - meter.spare)  # (this meter's spare too, if in the way)
            if self.refuses(nbytes - meter.spare):
                raise OverBudget(self.over(nbytes - meter.spare))
        more = nbytes - meter.spare
        user, ceiling = budget.user_budget, budget.ceiling
        new = not meter.cap
        if (not user or self.held + self.window + more + SLICE <= user * LEND_UNDER
                and (not new or (len(self.lent) + 1) * CAP <= user * LENT_SHARE)) \
                and (not ceiling or budget.held + budget.window + more + SLICE
                     <= ceiling * LEND_UNDER
                     and (not new or (len(budget.lent) + 1) * CAP <= ceiling * LENT_SHARE)):
            more += SLICE
            meter.spare = SLICE
            if new:
                meter.cap = CAP
                if self.lent is NONE_LENT:
                    self.lent = set()
                self.lent.add(meter)
                budget.lent.add(meter)
        else:
            meter.spare = 0
        self.held += more
        budget.held += more
        if self.held + self.window > budget.peak:
            budget.peak = self.held + self.window

    def repay(self, meter: Meter, keep: int) -> None:
        """A meter's spare beyond ``keep`` given back (``core.meter.Lender``)."""
        back = meter.spare - keep
        if back > 0:
            meter.spare = keep
            self.held -= back
            self.budget.held -= back

    def queued(self, change: int, nbytes: int, refusable: bool) -> str | None:
        """``core.meter.Account.queued``: ``over`` and two ``grow``s, written out (it
        runs for every message a session queues)."""
        budget = self.budget
        window = self.window + change
        budget.window += change
        if refusable and (
                budget.user_budget and self.held + window + nbytes > budget.user_budget
                or budget.ceiling and budget.held + budget.window + nbytes > budget.ceiling):
            self.window = window
            if budget.lent:  # (``change`` counted already: settling moves only spares)
                self.settle(nbytes)
                if not self.refuses(nbytes):
                    return self.queued(0, nbytes, False)
            return self.over(nbytes)
        self.window = window = window + nbytes
        budget.window += nbytes
        if self.held + window > budget.peak:
            budget.peak = self.held + window
        return None

    def settle(self, more: int) -> None:
        """Before refusing ``more`` bytes: the slices in the refusal's way taken back,
        where taking them back could let ``more`` in (a meter's spare is at most CAP):
        the user's own for their maxUserBytes, everyone's for the memoryCeiling. Never a
        walk of the sessions: ``MemoryBudget.take_back`` visits the lent meters only."""
        budget = self.budget
        user, ceiling = budget.user_budget, budget.ceiling
        mine = user and self.held + self.window + more > user
        if mine and self.held + self.window + more - len(self.lent) * CAP > user:
            return  # refused whatever the user's slices hold
        every = ceiling and budget.held + budget.window + more > ceiling
        if every and budget.held + budget.window + more - len(budget.lent) * CAP > ceiling:
            return  # refused whatever anyone's slices hold
        if every:
            budget.take_back(budget.lent)
        elif mine:
            budget.take_back(self.lent)

    def grow(self, nbytes: int) -> None:
        """The user's windows and unsent bytes changed by ``nbytes`` (less when a window
        evicted more than was queued): as each session queues, until the next tick."""
        self.window += nbytes
        self.worker.window += nbytes
        if self.held + self.window > self.budget.peak:
            self.budget.peak = self.held + self.window


class MemoryBudget:
    def __init__(self, user_budget: int, ceiling: int, kept: KeptSessions,
                 drop: Callable[[LiveSession, str], None]) -> None:
        self.user_budget = user_budget  # 0: none
        self.ceiling = ceiling  # 0: none
        self.kept = kept
        self.drop = drop  # ends a session (closing its transport, if any), saying why
        self.accounts: dict[str, Account] = {}
        #: all sessions: what their meters hold now, and their windows at the last tick
        self.held = 0
        self.window = 0
        #: the meters holding a slice (SLICE), every user's (``Account.lent``)
        self.lent: set[Meter] = set()
        #: the most any user's running count reached since the last review
        self.peak = 0
        self._reviewed_at: int | None = None

    @property
    def lenders(self) -> int:
        return len(self.lent)

    @property
    def total(self) -> int:
        return self.held + self.window

    def account(self, user_id: str) -> Account:
        account = self.accounts.get(user_id)
        if account is None:
            account = self.accounts[user_id] = Account(self)
        return account

    def bind(self, core: ProtocolSession) -> None:
        """Charge a session's meter (a new session, or one moved here) to its user."""
        meter = core.meter
        if meter.account is None:
            account = self.account(core.user_id)
            account.held += meter.held
            self.held += meter.held
            account.grow(meter.window)
            meter.account = account

    def forget(self, live: LiveSession) -> None:
        """A session is gone: what its meter held is given back now, not at the tick."""
        meter = live.core.meter
        account = meter.account
        if account is not None:
            account.give(meter.held + meter.spare)  # (its slice, if lent one)
            account.queued(-meter.window, 0, False)  # its window, given back
            if meter.cap and isinstance(account, Account):  # (a review took it back if not)
                account.lent.discard(meter)
                self.lent.discard(meter)
            meter.spare = meter.cap = 0
            meter.account = None

    def take_back(self, meters: set[Meter]) -> None:
        """The slices of ``meters`` (an account's ``lent``, or the worker's) taken back:
        their spare bytes no longer counted. (A meter moves bytes of its slice to its
        held and window bytes unseen: the sum stays exact, the split waits for the
        review.) Visits those meters only, each once."""
        whole = meters is self.lent
        while meters:
            meter = meters.pop()
            account = meter.account
            if isinstance(account, Account):
                account.held -= meter.spare
                self.held -= meter.spare
                if whole:
                    account.lent.discard(meter)
            if not whole:
                self.lent.discard(meter)
            meter.spare = meter.cap = 0

    def settle(self) -> None:
        """Every slice taken back (the review's first step; a refusal takes back only
        what is in its way: ``Account.settle``)."""
        self.take_back(self.lent)

    def admit(self, user_id: str) -> None:
        """Refuse a new session while the worker or the user is over budget."""
        if self.lent:  # not refused for slices lent (those in the way taken back)
            (self.accounts.get(user_id) or Account(self)).settle(0)
        if self.ceiling and self.total > self.ceiling:
            raise MaxConnections(f"the sessions hold {self.total} bytes "
                                 f"(memoryCeiling {self.ceiling})")
        account = self.accounts.get(user_id)
        if account is not None and self.user_budget \
                and account.held + account.window > self.user_budget:
            raise UserConnectionLimit(f"this user's sessions hold "
                                      f"{account.held + account.window} bytes "
                                      f"(maxUserBytes {self.user_budget})")

    def review_due(self, now: int, sessions: Callable[[], list[LiveSession]]) -> None:
        """The tick's review, when it can find something: a user's or the worker's
        running count within NEAR of its budget (the counts only lag the sessions by
        what they let go since: acks, the window's pruning), or FULL_EVERY_MS since
        the last (what the counts missed: a session gone without giving back)."""
        user, ceiling = self.user_budget, self.ceiling
        if (user and self.peak > user * NEAR) or (ceiling and self.total > ceiling * NEAR) \
                or self._reviewed_at is None or now - self._reviewed_at >= FULL_EVERY_MS:
            self._reviewed_at = now
            self.review(sessions())

    def review(self, sessions: list[LiveSession]) -> None:
        """Count every session again, then bring users and the worker back under budget."""
        by_user: dict[str, list[int]] = {}
        weights: dict[str, int] = {}
        total = 0
        for live in sessions:
            if live.core.closed:
                continue
            window = window_bytes(live)
            metered = live.core.meter.held
            weights[live.id] = held = window + metered
            sums = by_user.get(live.user_id)
            if sums is None:
                sums = by_user[live.user_id] = [0, 0]
            sums[0] += metered
            sums[1] += window
            total += held
        if self.user_budget:
            for user, (metered, window) in by_user.items():
                held = metered + window
                if held > self.user_budget:
                    total -= held
                    total += self._shed(user, held, self.user_budget, weights,
                                        "maxUserBytes")
        if self.ceiling and total > self.ceiling:
            self._shed(None, total, self.ceiling, weights, "memoryCeiling")
        self._recount(sessions, weights)

    def _recount(self, sessions: list[LiveSession], weights: dict[str, int]) -> None:
        """The accounts as the sessions still standing hold them: sessions shed by this
        review are left out, a user without sessions loses their account."""
        accounts: dict[str, Account] = {}
        held = window = 0
        self.settle()  # every lent meter's, a session gone unforgotten's included
        for live in sessions:
            weight = weights.get(live.id)
            if weight is None or live.core.closed:
                continue
            account = accounts.get(live.user_id)
            if account is None:
                account = self.accounts.get(live.user_id) or Account(self)
                account.held = account.window = 0
                accounts[live.user_id] = account
            meter = live.core.meter
            meter.account = account
            meter.window = weight - meter.held  # what its next message is counted from
            account.held += meter.held
            account.window += weight - meter.held
            held += meter.held
            window += weight - meter.held
        self.accounts = accounts
        self.held, self.window = held, window
        self.peak = max((a.held + a.window for a in accounts.values()), default=0)

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
