"""Connect tickets: a short-lived, single-use stand-in for a token in a URL.

A browser cannot set headers on a WebSocket or an EventSource, so its token would end up
in the URL, and from there in proxy access logs. Instead it POSTs its token once
(``POST /proto/ticket`` with ``Authorization: Bearer``) and connects with
``?ticket=<opaque>``: the ticket names the token's user, works once, and only for
``TICKET_LIFETIME_MS``. This module holds tickets in memory (one process); a cluster keeps
them in Redis (``protoflask.cluster.tickets``) so any worker redeems them.
"""

from __future__ import annotations

import secrets
import time
from typing import Protocol

#: The longest a ticket lives (docs/PROTOCOL.md: at most 30 s).
TICKET_LIFETIME_MS = 30_000
#: Most tickets held in memory at once; the oldest go first beyond it.
MAX_MEMORY_TICKETS = 100_000


def new_ticket() -> str:
    return secrets.token_urlsafe(24)


def issue_ticket(store: "TicketStore", user_id: str,
                 token_exp: float | None) -> tuple[str, int]:
    """A ticket for a verified token's user and its lifetime in ms: the store's, cut to
    what is left of the token's ``exp`` (seconds since the epoch; at least 1 ms), so a
    ticket never outlives the token it stands for (docs/PROTOCOL.md §1.2)."""
    lifetime_ms = store.lifetime_ms
    if token_exp is not None:
        lifetime_ms = max(1, min(lifetime_ms, int(token_exp * 1000 - time.time() * 1000)))
    return store.issue(user_id, lifetime_ms), lifetime_ms


class TicketStore(Protocol):
    lifetime_ms: int

    def issue(self, user_id: str, lifetime_ms: int | None = None) -> str:
        """A new ticket for the user, valid for ``lifetime_ms`` (at most the store's
        ``lifetime_ms``, its default: the token's remaining life may be shorter)."""

    def redeem(self, ticket: str) -> str | None:
        """The ticket's user, once; None for an unknown, used or expired ticket."""


class MemoryTicketStore:
    """Tickets of one process, in a dict ordered by issue time."""

    def __init__(self, lifetime_ms: int = TICKET_LIFETIME_MS) -> None:
        self.lifetime_ms = lifetime_ms
        self._tickets: dict[str, tuple[str, float]] = {}  # ticket -> (user, expires at)

    def issue(self, user_id: str, lifetime_ms: int | None = None) -> str:
        now = time.monotonic()
        self._drop_expired(now)
        while len(self._tickets) >= MAX_MEMORY_TICKETS:
            del self._tickets[next(iter(self._tickets))]
        ticket = new_ticket()
        ms = self.lifetime_ms if lifetime_ms is None else min(lifetime_ms, self.lifetime_ms)
        self._tickets[ticket] = (user_id, now + ms / 1000.0)
        return ticket

    def redeem(self, ticket: str) -> str | None:
        entry = self._tickets.pop(ticket, None)
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]

    def _drop_expired(self, now: float) -> None:
        """Drop the expired tickets from the front: issued in order, so (nearly) expiring
        in order. Only those are looked at (copying every live ticket first made each issue
        cost in proportion to the tickets alive); one cut short by its token's expiry may
        wait behind a longer one, and is refused by ``redeem`` meanwhile."""
        tickets = self._tickets
        while tickets:
            ticket = next(iter(tickets))
            if tickets[ticket][1] > now:
                return
            del tickets[ticket]
