"""The per-session token bucket and its strikes (core/ratelimit.py)."""

from __future__ import annotations

from protoflask.core.ratelimit import RateLimiter, Verdict


def verdicts(limiter: RateLimiter, times: list[int]) -> list[str]:
    return [limiter.check(t).value for t in times]


def test_a_burst_then_the_rate():
    limiter = RateLimiter(rate=10, burst=3, now=0)
    assert verdicts(limiter, [0, 0, 0, 0]) == ["allow", "allow", "allow", "drop"]
    assert limiter.retry_after_ms() == 100
    assert verdicts(limiter, [100, 100]) == ["allow", "drop"]  # one token per 100 ms


def test_flooding_past_the_burst_of_strikes_asks_for_the_close():
    limiter = RateLimiter(rate=10, burst=3, now=0)
    out = verdicts(limiter, [0] * 7)
    assert out == ["allow"] * 3 + ["drop"] * 3 + ["close"]


def test_strikes_drain_at_the_rate():
    limiter = RateLimiter(rate=10, burst=3, now=0)
    verdicts(limiter, [0] * 6)  # 3 strikes
    # a client a little over its limit is never closed: one token and one strike drain
    # every 100 ms
    for t in range(100, 3000, 50):
        assert limiter.check(t) is not Verdict.CLOSE


def test_off_when_the_rate_is_zero():
    limiter = RateLimiter(rate=0, burst=1, now=0)
    assert set(verdicts(limiter, [0] * 100)) == {"allow"}


def test_a_clock_stepping_back_does_not_stall_the_bucket():
    limiter = RateLimiter(rate=10, burst=1, now=1_000_000)
    assert limiter.check(1_000_000) is Verdict.ALLOW
    assert limiter.check(0) is Verdict.DROP  # the clock went back an age
    assert limiter.check(100) is Verdict.ALLOW  # and refills from there
