"""The disconnected sessions this process keeps for a resume, per user: at most
maxKeptSessionsPerUser of them, the oldest beyond that dropped as if they had expired.
"""

from __future__ import annotations

import logging
from typing import Callable

from .hub import Hub
from .live import LiveSession

log = logging.getLogger("protoflask")

PRUNE_EVERY_MS = 60_000


class KeptSessions:
    def __init__(self, hub: Hub, cap: int, expire: Callable[[LiveSession], None]) -> None:
        self.hub = hub
        self.cap = cap
        self.expire = expire  # how a session beyond the cap is dropped
        #: per user: ids of this process's disconnected sessions, oldest first
        self._by_user: dict[str, dict[str, None]] = {}
        self._pruned_at = 0

    def keep(self, live: LiveSession) -> None:
        """A session just disconnected: the user's oldest disconnected sessions beyond
        the cap are dropped (as if they had expired)."""
        kept = self._by_user.setdefault(live.user_id, {})
        kept.pop(live.id, None)
        kept[live.id] = None  # newest last
        if len(kept) <= self.cap:
            return
        for sid in list(kept):
            if len(kept) <= self.cap:
                break
            other = self.hub.get(sid)
            if other is None or other.core.closed or other.transport is not None:
                del kept[sid]  # gone or connected again meanwhile
            else:
                log.info("session %s: user %s keeps more than %d disconnected sessions; "
                         "dropping the oldest", sid, live.user_id, self.cap)
                other.core.close()
                self.expire(other)

    def connected(self, live: LiveSession) -> None:
        """The session has a transport again: no longer kept."""
        kept = self._by_user.get(live.user_id)
        if kept is not None:
            kept.pop(live.id, None)

    def forget(self, live: LiveSession) -> None:
        """The session is gone for good."""
        kept = self._by_user.get(live.user_id)
        if kept is not None:
            kept.pop(live.id, None)
            if not kept:
                del self._by_user[live.user_id]

    def oldest(self, user_id: str | None = None) -> list[LiveSession]:
        """The user's (or everyone's) kept sessions still here and disconnected, those
        disconnected longest ago first."""
        users = [user_id] if user_id is not None else list(self._by_user)
        out = []
        for user in users:
            for sid in self._by_user.get(user, ()):
                live = self.hub.get(sid)
                if live is not None and live.transport is None and not live.core.closed:
                    out.append(live)
        if user_id is None:
            out.sort(key=lambda live: live.core.disconnected_at or 0)
        return out

    def prune(self, now: int) -> None:
        """Forget kept ids whose sessions went away without ``forget`` (taken over by
        another node); once a minute."""
        if now - self._pruned_at < PRUNE_EVERY_MS:
            return
        self._pruned_at = now
        for user in list(self._by_user):
            kept = self._by_user[user]
            for sid in [s for s in kept if self.hub.get(s) is None]:
                del kept[sid]
            if not kept:
                del self._by_user[user]
