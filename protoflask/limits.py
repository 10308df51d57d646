"""maxConnectionsPerUser: per user, how many live transports and how many POST bodies
being read are open, each counted against the cap on its own.

With the default cap (a tenth of maxConnections) ten users at their cap would hold
every slot. So, unless maxConnectionsPerUser is set, the last tenth of maxConnections
is kept for light users: a user who already holds a hundredth of maxConnections (10
at the defaults) is refused (USER_CONNECTION_LIMIT) once no more than a tenth of the
slots are free. Heavy users together then hold at most nine tenths, and the rest is
there for at least as many other users as a heavy one could hold connections."""

from __future__ import annotations

from .config import ServerConfig
from .core.errors import UserConnectionLimit


def user_caps(config: ServerConfig) -> "UserCaps":
    """The caps of ``config``: the reserve only under the default per-user cap."""
    reserved = config.max_connections if config.max_connections_per_user is None else 0
    return UserCaps(config.connections_per_user, reserved)


class UserCaps:
    def __init__(self, cap: int, max_connections: int = 0) -> None:
        """``max_connections``: keep the last tenth of it for light users (0: no
        reserve)."""
        self.cap = cap
        self.reserve = max_connections // 10
        self.light = max(1, max_connections // 100)
        self.free = max_connections  # slots not held by any user's transport
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
        if self.reserve and not replacing and held >= self.light \
                and self.free <= self.reserve:
            raise UserConnectionLimit(
                f"this user has {held} live connections open and the last {self.reserve} "
                "slots are kept for users with fewer than " f"{self.light}")
        self._connections[user_id] = held + 1
        self.free -= 1

    def release_connection(self, user_id: str) -> None:
        if self._connections.get(user_id):
            self.free += 1
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
