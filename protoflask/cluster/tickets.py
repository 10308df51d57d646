"""Connect tickets in Redis, so a ticket issued by one worker is redeemed by any other
(the in-memory store and the ticket rules: ``protoflask.tickets``).

    {p}:ticket:{ticket}   string the user id, expiring with the ticket (GETDEL: once)
"""

from __future__ import annotations

import redis

from ..core.errors import ClusterUnavailable
from ..tickets import TICKET_LIFETIME_MS, new_ticket
from .redis_client import UNAVAILABLE, text


class RedisTicketStore:
    def __init__(self, client: redis.Redis, prefix: str,
                 lifetime_ms: int = TICKET_LIFETIME_MS) -> None:
        self.redis = client
        self.prefix = prefix.rstrip(":")
        self.lifetime_ms = lifetime_ms

    def _key(self, ticket: str) -> str:
        return f"{self.prefix}:ticket:{ticket}"

    def issue(self, user_id: str, lifetime_ms: int | None = None) -> str:
        ticket = new_ticket()
        ms = self.lifetime_ms if lifetime_ms is None else min(lifetime_ms, self.lifetime_ms)
        try:
            self.redis.set(self._key(ticket), user_id.encode(), px=max(1, ms))
        except UNAVAILABLE as exc:
            raise ClusterUnavailable(f"cannot store the ticket: {exc}") from None
        return ticket

    def redeem(self, ticket: str) -> str | None:
        if len(ticket) > 100:
            return None
        try:
            user = self.redis.getdel(self._key(ticket))
        except UNAVAILABLE:
            return None  # refused (401): the client asks for a new ticket or uses a token
        return text(user) if user is not None else None
