"""Turns: how a greenlet doing a long piece of work for one client lets every other
greenlet of the worker have its turn (issue 24, the tiny-call flood).

``gevent.sleep(0)`` is not such a turn when the work between two calls is long: it
queues a callback, and gevent's loop runs the callbacks queued while it is running
callbacks before it polls the sockets again, checking the time only every 50 of them.
A reader that handled one costly message (a tool call of 300,000 ``{}``: about 25 ms)
and then "yielded" that way went on with the next one at once, up to 50 times, while a
bystander's bytes waited unread: its PING took 0.4-0.5 s, its new connection over a
second (docs/RELIABILITY.md, section 22). ``give_turn`` waits on a timer instead, which
fires only after the loop has polled the sockets: every greenlet that was ready or whose
socket has bytes runs first.

``SLICE`` is how long a reader works on what one read (or one body) brought before it
gives the turn; the cheap common read never reaches it, so it costs nothing there.
"""

from __future__ import annotations

from time import monotonic

import gevent

#: s of work on one client's bytes before the others get a turn (gevent's own switch
#: interval is 5 ms)
SLICE = 0.005
SLICE_MS = 5
#: a timer this short fires right after the loop's next poll of the sockets
_POLLED = 1e-6


def give_turn() -> None:
    """Let every greenlet that is ready, or whose socket has bytes, run before going on."""
    gevent.sleep(_POLLED)


#: s: a turn (one read's handling, one slice of it or of a body) at least this long is
#: costly, and its user owes the worker as long a pause (``Pacer``). Cheap turns (the
#: common read of small messages takes well under a millisecond) are never paced.
COSTLY = 0.010


#: users owing a pause beyond which the ones already paid up are forgotten
FORGET_PAST = 1024


class Pacer:
    """The worker's: the pause each user owes for their costly turns.

    After a costly turn of ``s`` seconds, the user's readers (every connection and body
    of theirs) wait until ``s`` after the later of now and the end of their last pause, so
    that costly work of one user gets at most about half of the worker however many
    connections carry it, and what it leaves is time in which everyone else is served
    (issue 24: a bystander's every step waited for one of the flooder's messages).
    Cheap turns owe nothing: a user alone on the worker with ordinary traffic is never
    slowed."""

    __slots__ = ("owed",)

    def __init__(self) -> None:
        self.owed: dict[str, float] = {}  # user -> monotonic s until which they pause

    def pause(self, user: str) -> bool:
        """Before a turn of ``user``'s: wait out what they owe (a real turn for the
        others); whether there was anything to wait."""
        owed = self.owed
        until = owed.get(user)
        waited = False
        while until is not None:
            now = monotonic()
            if now >= until:
                if owed.get(user) == until:
                    del owed[user]
                break
            gevent.sleep(until - now)
            waited = True
            until = owed.get(user)
        return waited

    def took(self, user: str, seconds: float) -> None:
        """A turn of ``user``'s took ``seconds``: if that was costly, they owe as long.
        Then the others get a turn: the user's pause if they owe (for this turn or for
        one of their other connections'), else ``give_turn``."""
        if seconds >= COSTLY:
            now = monotonic()
            owed = self.owed
            if len(owed) >= FORGET_PAST:  # users paid up who never came back to pause
                for stale in [u for u, until in owed.items() if until <= now]:
                    del owed[stale]
            owed[user] = max(owed.get(user, now), now) + seconds
        if not (self.owed and self.pause(user)):
            give_turn()
