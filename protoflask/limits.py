"""maxConnectionsPerUser: per user, how many live transports and how many POST bodies
being read are open, each counted against the cap on its own."""

from __future__ import annotations

from .core.errors import UserConnectionLimit


class UserCaps:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._connections: dict[str, int] = {}
        self._bodies: dict[str, int] = {}

    def take_connection(self, user_id: str, replacing: bool = False) -> None:
        """Count one more live transport of the user, or raise USER_CONNECTION_LIMIT.
        ``replacing``: it takes over one of the user's transports (a resume), whose slot
        is given back when it attaches, so it is let in one over the cap; never more, or
        resumes started together would each take a slot."""
        held = self._connections.get(user_id, 0)
        if held >= self.cap + (1 if replacing else 0):
            raise UserConnectionLimit(f"this user has {held} live connections open "
                                      f"(maxConnectionsPerUser {self.cap})")
        self._connections[user_id] = held + 1

    def release_connection(self, user_id: str) -> None:
        _release(self._connections, user_id)

    def take_body(self, user_id: str) -> None:
        """Count one more POST body being read for the user, or raise
        USER_CONNECTION_LIMIT."""
        held = self._bodies.get(user_id, 0)
        if held >= self.cap:
            raise UserConnectionLimit(f"this user has {held} request bodies being read "
                                      f"(maxConnectionsPerUser {self.cap})")
        self._bodies[user_id] = held + 1

    def release_body(self, user_id: str) -> None:
        _release(self._bodies, user_id)


def _release(counts: dict[str, int], user_id: str) -> None:
    left = counts.get(user_id, 0) - 1
    if left > 0:
        counts[user_id] = left
    else:
        counts.pop(user_id, None)
