"""What a client does with 503 CLUSTER_UNAVAILABLE (Retry-After): tries again."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from ..support import timeout

T = TypeVar("T")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a test client's refusal carries (WebSocket or HTTP), if any."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None) or getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def when_served(connect: Callable[[], T], within: float = 10.0) -> T:
    """``connect()``, again after each 503 (as protoflask's clients do), for ``within``
    seconds; anything else it raises is raised."""
    deadline = time.monotonic() + timeout(within)
    while True:
        try:
            return connect()
        except Exception as exc:
            if status_of(exc) != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
