"""Per-session upstream message rate limit: a token bucket, plus a second bucket of
strikes that tells a client over its limit now and then from one that keeps flooding.

Time is passed in (ms), like everywhere in the core.

* Each received message takes one token; tokens refill at ``rate`` per second up to
  ``burst``. A message that finds no token is dropped (the session answers it with
  ``ERROR RATE_LIMITED``).
* Each ERROR the session sends takes a token too (``charge``), or adds a strike when
  none is left: error replies are work the client makes the server do.
* Each dropped message adds a strike; strikes leak at ``rate`` per second. More than
  ``burst`` strikes means the client sent well over twice its limit for a while: the
  session asks for the connection to be closed (1008).
"""

from __future__ import annotations

from enum import Enum

from .errors import RateLimited


class Verdict(Enum):
    ALLOW = "allow"
    DROP = "drop"
    CLOSE = "close"


_ALLOW = Verdict.ALLOW  # read for every message: cheaper as a constant than off the class


class RateLimiter:
    __slots__ = ("rate", "burst", "_tokens", "_strikes", "_at", "flooding")

    def __init__(self, rate: float, burst: int, now: int) -> None:
        self.rate = rate  # messages per second; 0 turns the limit off
        self.burst = burst
        self._tokens = float(burst)
        self._strikes = 0.0
        self._at = now
        #: a CLOSE was asked for: later messages are dropped unread, and unanswered
        self.flooding = False

    def check(self, now: int) -> Verdict:
        """Take a token for one message received at ``now`` (ms)."""
        if self.rate <= 0:
            return _ALLOW
        # a clock that steps back refills nothing this once, and does not stall refills
        elapsed = now - self._at
        if elapsed > 0:
            self._at = now
            refill = elapsed * self.rate / 1000.0
            tokens = self._tokens + refill
            self._tokens = tokens if tokens < self.burst else float(self.burst)
            strikes = self._strikes - refill
            self._strikes = strikes if strikes > 0.0 else 0.0
        elif elapsed < 0:
            self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return _ALLOW
        self._strikes += 1.0
        return Verdict.CLOSE if self._strikes > self.burst else Verdict.DROP

    def refusal(self, verdict: Verdict) -> RateLimited | None:
        """The ERROR for a message ``check`` refused (None while flooding); a CLOSE
        verdict starts the flooding."""
        if self.flooding:
            return None
        self.flooding = verdict is Verdict.CLOSE
        return RateLimited(f"more than {self.rate:g} messages per second (burst "
                           f"{self.burst}); message dropped",
                           detail={"retry_after_ms": self.retry_after_ms()})

    def charge(self) -> None:
        """Take a token for something the session did for the client (an ERROR it sent):
        a token if there is one, else a strike. Refills happen at the next ``check``."""
        if self.rate <= 0:
            return
        if self._tokens >= 1.0:
            self._tokens -= 1.0
        else:
            self._strikes += 1.0

    def retry_after_ms(self) -> int:
        """How long until the next token (for the ERROR's detail)."""
        if self.rate <= 0 or self._tokens >= 1.0:
            return 0
        return max(1, int((1.0 - self._tokens) * 1000.0 / self.rate + 0.999))


#: The limiter of every session without a rate limit (``rate`` 0): with no rate nothing
#: in it changes (``check`` allows before reading anything, ``charge`` returns, so no
#: refusal sets ``flooding``), so one serves them all, one object fewer a session.
UNLIMITED = RateLimiter(0, 0, 0)


def limiter(rate: float, burst: int, now: int) -> RateLimiter:
    """A session's limiter: its own, or ``UNLIMITED`` when ``rate`` turns the limit off."""
    return RateLimiter(rate, burst, now) if rate > 0 else UNLIMITED
