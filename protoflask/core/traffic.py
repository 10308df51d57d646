"""Message counters every session of a server shares: plain ints in dicts, bumped on
the hot path (one dict update per message) and read at scrape time by /metrics.

Type labels are bounded: a type a client invents counts as ``unknown``, a message whose
envelope could not be read as ``invalid``; the application's own message types count
under their names (the application chooses how many there are).
"""

from __future__ import annotations

from .envelope import CLIENT_TYPES, SERVER_TYPES

UNKNOWN_TYPE = "unknown"
INVALID = "invalid"


class TrafficCounters:
    """The session bumps these inline (``received[type] += 1``, falling back to
    ``unknown`` for a type not listed; ``sent[type]``, adding an application's own type)."""

    __slots__ = ("received", "sent", "replays", "replayed_messages", "attached")

    def __init__(self) -> None:
        # Every label exists from the start (a series at 0 rather than none), and a
        # known type is then one ``counts[type] += 1`` with no lookup miss.
        self.received: dict[str, int] = dict.fromkeys(
            sorted(CLIENT_TYPES | {UNKNOWN_TYPE, INVALID}), 0)
        self.sent: dict[str, int] = dict.fromkeys(sorted(SERVER_TYPES), 0)
        #: (source "resume" | "request", result "complete" | "unavailable") -> count
        self.replays: dict[tuple[str, str], int] = {
            (source, result): 0 for source in ("resume", "request")
            for result in ("complete", "unavailable")}
        self.replayed_messages = 0
        #: sessions with a transport attached now, kept by the sessions' state changes
        #: (so /metrics need not walk every session to count them)
        self.attached = 0
