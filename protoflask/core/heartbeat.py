"""The server's heartbeat (docs/PROTOCOL.md §6): a PING every heartbeatInterval while a
transport is attached, each to be answered by a PONG with its nonce within
heartbeatTimeout. Time is passed in (ms); the session sends the PING and reports the
timeout."""

from __future__ import annotations

import secrets

from .settings import SessionSettings


class Heartbeat:
    __slots__ = ("settings", "nonce", "sent_at", "next_at")

    def __init__(self, settings: SessionSettings, now: int) -> None:
        self.settings = settings
        #: the PING waiting for its PONG (None: none is)
        self.nonce: str | None = None
        self.sent_at = 0
        self.next_at = now + settings.heartbeat_interval

    def restart(self, now: int) -> None:
        """A transport is attached: the first PING one interval from now."""
        self.next_at = now + self.settings.heartbeat_interval

    def beat(self, now: int) -> tuple[str | None, bool]:
        """(the nonce of a PING to send now, whether the last PING went unanswered)."""
        if self.nonce is not None:
            if now - self.sent_at >= self.settings.heartbeat_timeout:
                self.nonce = None
                return None, True
            return None, False
        if now < self.next_at:
            return None, False
        self.nonce = nonce = f"hb-{secrets.token_urlsafe(12)}"  # unguessable: no blind PONGs
        self.sent_at = now
        self.next_at = now + self.settings.heartbeat_interval
        return nonce, False

    def answered(self, nonce: str) -> None:
        """A PONG came with ``nonce``."""
        if self.nonce is not None and nonce == self.nonce:
            self.nonce = None
