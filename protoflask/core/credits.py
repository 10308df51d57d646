"""Flow-control ledger for one session: message and byte credits, per channel, both ways.

Rules (docs/PROTOCOL.md §5 Flow control, which says the same for clients):

- Upstream, the server is the receiver. Each channel starts with
  ``initial_credit_messages`` / ``initial_credit_bytes``. A message costs 1 message
  credit and its encoded length in byte credits; without enough it is rejected
  (INSUFFICIENT_CREDITS) and costs nothing.
- After the server processed a message it tops the channel up with one FLOW_UPDATE
  when the remaining message credit is ``<= credit_threshold`` or the remaining byte
  credit is ``<= initial_credit_bytes // 4``. The top-up brings the remaining message
  credit to ``credit_threshold + grant`` and the remaining byte credit back to
  ``initial_credit_bytes``, so what a client holds stays bounded whatever the settings.
- ``grant`` starts at ``initial_credits`` (clamped to min..max when adaptive). With
  adaptive adjustment it doubles toward ``max_credits`` when the session keeps up and
  halves toward ``min_credits`` when it is under load; without it, it stays put at
  exactly ``initial_credits``.
- Downstream, the client is the receiver, but only when it asks to be: a HELLO whose
  ``capabilities.flow_control.downstream`` is ``true`` makes the session count downstream
  credit (each channel starts with the client's ``initial_credit_messages`` /
  ``initial_credit_bytes``, else ``initial_credits`` / ``initial_credit_bytes``;
  FLOW_UPDATE from the client adds to it). Any other client is sent everything without
  counting (docs/PROTOCOL.md §5.2): a client that announces credit it never
  tops up must not be stalled.
- Control types never spend credit; with ``enabled=False`` nothing is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InsufficientCredits


@dataclass(frozen=True, slots=True)
class CreditSettings:
    """No defaults: ``protoflask.config`` declares them once (``FLOW_OPTIONS``)."""

    enabled: bool
    initial_credits: int
    min_credits: int
    max_credits: int
    credit_threshold: int
    adaptive_adjustment: bool
    initial_credit_messages: int
    initial_credit_bytes: int


class _Account:
    __slots__ = ("messages", "bytes")

    def __init__(self, messages: int, nbytes: int | None) -> None:
        self.messages = messages
        self.bytes = nbytes  # None: unlimited


class CreditLedger:
    __slots__ = ("settings", "_up", "_down", "grant", "_byte_threshold", "_down_messages",
                 "_down_bytes", "downstream_enabled")

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings
        self._up: dict[str, _Account] = {}
        self._down: dict[str, _Account] = {}
        # Without adaptive adjustment the grant is exactly initial_credits (docs/PROTOCOL.md §5: no
        # relation to min/max is required); min..max only bound adaptive grant sizes.
        self.grant = (max(settings.min_credits, min(settings.max_credits, settings.initial_credits))
                      if settings.adaptive_adjustment else settings.initial_credits)
        self._byte_threshold = settings.initial_credit_bytes // 4
        self._down_messages = settings.initial_credits
        self._down_bytes: int | None = None
        # the client asked for downstream credit (HELLO flow_control.downstream: true)
        self.downstream_enabled = False

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    # -- upstream: the client spends what the server granted ------------------------------

    def _up_account(self, channel: str) -> _Account:
        acct = self._up.get(channel)
        if acct is None:
            s = self.settings
            acct = self._up[channel] = _Account(s.initial_credit_messages, s.initial_credit_bytes)
        return acct

    def charge(self, channel: str, nbytes: int) -> None:
        """Spend credit for one received message, or raise InsufficientCredits."""
        if not self.settings.enabled:
            return
        acct = self._up_account(channel)
        if acct.messages < 1 or (acct.bytes is not None and acct.bytes < nbytes):
            raise InsufficientCredits(
                f"channel {channel} has {acct.messages} message and {acct.bytes} byte credits;"
                f" the message needs 1 and {nbytes}",
                detail={"channel": channel, "messages": acct.messages, "bytes": acct.bytes,
                        "needed_bytes": nbytes})
        acct.messages -= 1
        acct.bytes -= nbytes  # type: ignore[operator]

    def replenish(self, channel: str, *, under_load: bool = False) -> tuple[int, int] | None:
        """After processing: (add_messages, add_bytes) to announce, or None."""
        if not self.settings.enabled:
            return None
        acct = self._up_account(channel)
        assert acct.bytes is not None
        if acct.messages > self.settings.credit_threshold and acct.bytes > self._byte_threshold:
            return None
        if self.settings.adaptive_adjustment:
            s = self.settings
            self.grant = (max(s.min_credits, self.grant // 2) if under_load
                          else min(s.max_credits, self.grant * 2))
        add_messages = max(0, self.settings.credit_threshold + self.grant - acct.messages)
        add_bytes = max(0, self.settings.initial_credit_bytes - acct.bytes)
        acct.messages += add_messages
        acct.bytes += add_bytes
        return add_messages, add_bytes

    def top_up_bytes(self, channel: str, needed_bytes: int) -> tuple[int, int] | None:
        """A message of ``needed_bytes`` was refused for want of byte credit while message
        credit was left: (0, add_bytes) restoring the channel's bytes, so that it can be
        sent again (the usual top-up waits for a quarter to be left, which a large
        message may never let happen). None when that would not help or not be needed."""
        if not self.settings.enabled:
            return None
        acct = self._up_account(channel)
        assert acct.bytes is not None
        add_bytes = self.settings.initial_credit_bytes - acct.bytes
        if acct.messages < 1 or add_bytes <= 0 or acct.bytes >= needed_bytes \
                or needed_bytes > self.settings.initial_credit_bytes:  # would never fit
            return None
        acct.bytes += add_bytes
        return 0, add_bytes

    def upstream(self) -> dict[str, tuple[int, int]]:
        """Remaining upstream credit per channel that has been used: (messages, bytes)."""
        return {ch: (a.messages, a.bytes or 0) for ch, a in self._up.items()}

    # -- downstream: the server spends what the client granted ---------------------------

    def announce_client_credit(self, messages: int | None, nbytes: int | None,
                               downstream: bool = True) -> None:
        """The client's HELLO capabilities.flow_control: whether it takes part in downstream
        credit at all (``downstream``), and the per-channel starting credit if it does.
        Every HELLO decides anew, so a re-HELLO after a resume restarts the count."""
        self.downstream_enabled = downstream
        self._down_messages = self.settings.initial_credits if messages is None else messages
        self._down_bytes = self.settings.initial_credit_bytes if nbytes is None else nbytes
        for acct in self._down.values():  # channels used before HELLO start over
            acct.messages, acct.bytes = self._down_messages, self._down_bytes

    def _down_account(self, channel: str) -> _Account:
        acct = self._down.get(channel)
        if acct is None:
            acct = self._down[channel] = _Account(self._down_messages, self._down_bytes)
        return acct

    def can_send(self, channel: str, nbytes: int) -> bool:
        if not self.downstream_enabled or not self.settings.enabled:
            return True
        acct = self._down_account(channel)
        return acct.messages >= 1 and (acct.bytes is None or acct.bytes >= nbytes)

    def spend(self, channel: str, nbytes: int) -> None:
        if not self.downstream_enabled or not self.settings.enabled:
            return
        acct = self._down_account(channel)
        acct.messages -= 1
        if acct.bytes is not None:
            acct.bytes -= nbytes

    def add_client_credit(self, channel: str, add_messages: int, add_bytes: int) -> None:
        acct = self._down_account(channel)
        acct.messages += add_messages
        if acct.bytes is not None:
            acct.bytes += add_bytes

    def downstream(self) -> dict[str, tuple[int, int | None]]:
        """Remaining downstream credit per channel; empty for a client not taking part."""
        if not self.downstream_enabled:
            return {}
        return {ch: (a.messages, a.bytes) for ch, a in self._down.items()}

    # -- moving to another node (core.handoff) --------------------------------------------

    def export(self) -> dict[str, Any]:
        """The ledger as JSON-ready data."""
        # loops, not comprehensions (no frame each): a cluster exports this per batch
        up: dict[str, list[int | None]] = {}
        for ch, a in self._up.items():
            up[ch] = [a.messages, a.bytes]
        down: dict[str, list[int | None]] = {}
        for ch, a in self._down.items():
            down[ch] = [a.messages, a.bytes]
        return {
            "grant": self.grant,
            "downstream": self.downstream_enabled,
            "down_default": [self._down_messages, self._down_bytes],
            "up": up,
            "down": down,
        }

    def plain(self) -> tuple[int, bool, int, int | None] | None:
        """What ``export`` depends on while no channel has an account (the ledger's common
        state when only control messages pass), to tell it unchanged without exporting
        it; None once a channel has one (then every message may change it)."""
        if self._up or self._down:
            return None
        return (self.grant, self.downstream_enabled, self._down_messages, self._down_bytes)

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the state ``export`` wrote."""
        self.grant = int(saved["grant"])
        # absent in a state exported before downstream credit was opt-in: not counting
        # never stalls the client
        self.downstream_enabled = saved.get("downstream") is True
        self._down_messages, self._down_bytes = saved["down_default"]
        self._up = {ch: _Account(m, b) for ch, (m, b) in saved["up"].items()}
        self._down = {ch: _Account(m, b) for ch, (m, b) in saved["down"].items()}
