"""The session layer's ticker: one greenlet per engine that runs its ``tick`` (heartbeat,
expiry, the memory budget's review, the held figures) every ``period`` seconds. A tick
that raises is logged and reported (``report``: the ``error`` signal), never the
ticker's end."""

from __future__ import annotations

import logging
from typing import Callable

import gevent

from .config import ServerConfig

log = logging.getLogger("protoflask")


def tick_period(config: ServerConfig) -> float:
    """A quarter of the shorter of heartbeatInterval and heartbeatTimeout, in seconds,
    between 20 ms and 1 s."""
    shortest = min(config.heartbeat_interval, config.heartbeat_timeout)
    return max(0.02, min(1.0, shortest / 4000.0))


class Ticker:
    def __init__(self, tick: Callable[[], None], period: float,
                 report: Callable[[BaseException], None]) -> None:
        self.tick, self.period, self.report = tick, period, report
        #: the ticking greenlet (None while stopped)
        self.greenlet: gevent.Greenlet | None = None

    def start(self) -> bool:
        """Start ticking in the current hub, once: whether it started now."""
        if self.greenlet is not None and not self.greenlet.dead:
            return False
        self.greenlet = gevent.spawn(self._forever)
        return True

    def stop(self) -> None:
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
            self.greenlet = None

    def _forever(self) -> None:
        while True:
            gevent.sleep(self.period)
            try:
                self.tick()
            except Exception as exc:  # never let one bad session stop the heartbeat
                log.exception("heartbeat tick failed")
                self.report(exc)
