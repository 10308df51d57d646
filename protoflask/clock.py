"""The wall clock in milliseconds: the one ``now_ms`` every layer above the core reads
(the core itself never reads a clock; its callers pass this value in)."""

from __future__ import annotations

import time

#: the clock in nanoseconds; ``now_ms()`` is ``now_ns() // 1_000_000``, which the per-message
#: paths write inline (a Python call costs more than the reading itself)
now_ns = time.time_ns


def now_ms() -> int:
    return time.time_ns() // 1_000_000  # read several times per message: the cheapest way
