"""What a session's client made it hold beyond its replay window and unsent bytes (open
texts' parts, tool calls' params, runs' metadata), counted in bytes of memory as each
thing is admitted and given back as it goes (docs/PROTOCOL.md §1.4).

A ``Meter`` belongs to one session. The layer above may hand it an ``Account`` (the
user's, in ``protoflask.budget``) that refuses a charge which would take the user or the
worker over their budget: the refusal is an ``OverBudget`` whose message the caller puts
in the contract's error for what was refused (MESSAGE_TOO_LARGE for a text part,
MAX_RUNS_EXCEEDED for a tool call or a run). A charge is a few additions, so it is made
at every admission: the budget holds at its peaks, not only when a tick looks.
"""

from __future__ import annotations

from sys import getsizeof
from typing import Any, Protocol

import orjson


class OverBudget(Exception):
    """A charge refused: the user's or the worker's budget would be exceeded."""


class Account(Protocol):
    def take(self, nbytes: int) -> None:
        """Count ``nbytes`` more, or raise OverBudget (then nothing is counted)."""

    def give(self, nbytes: int) -> None:
        """Count ``nbytes`` less."""

    def queued(self, change: int, nbytes: int, refusable: bool) -> str | None:
        """A session's window and unsent bytes changed by ``change`` since it last told,
        and a message of ``nbytes`` is to be queued: count both, or, for a
        ``refusable`` message that would take the user or the worker over budget, only
        ``change`` and return why."""


class Lender(Account, Protocol):
    """An account that may lend a meter a slice of its budget (``protoflask.budget``):
    bytes it counts as the meter's (``Meter.spare``) which the meter then charges and
    gives back without asking, until they run out or pass ``Meter.cap``."""

    def lend(self, meter: "Meter", nbytes: int) -> None:
        """``take``, for a meter whose spare is short of ``nbytes``: counts ``nbytes``
        less the spare, and sets the meter's ``spare`` (and ``cap``) anew; or raises
        OverBudget, the meter unchanged. (The meter adds ``nbytes`` to ``held``.)"""

    def repay(self, meter: "Meter", keep: int) -> None:
        """The meter's spare beyond ``keep`` given back."""


class Meter:
    """One session's count. With a ``Lender`` account, ``spare`` bytes are counted by
    the account beyond ``held`` and ``window`` (a slice lent, at most ``cap``): charges,
    releases and queued messages that fit in it change the meter only. The account's
    count is then ``held + window + spare`` summed over its meters, never less than
    what they hold; ``cap`` 0 (no slice lent: any other account, or a budget that lends
    none) means every change goes to the account, as each is made."""

    __slots__ = ("held", "window", "account", "spare", "cap")

    def __init__(self) -> None:
        self.held = 0
        #: the session's replay window and unsent bytes as last told to its account
        self.window = 0
        self.account: Account | None = None
        #: bytes the account counts for this meter beyond ``held`` and ``window``
        self.spare = 0
        #: the most ``spare`` may grow to before the meter gives back (0: no slice)
        self.cap = 0

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` more for this session, or raise OverBudget."""
        spare = self.spare
        if nbytes < spare:  # within the slice: the account counted it already
            self.spare = spare - nbytes
        else:
            account = self.account
            if account is not None:
                lend = getattr(account, "lend", None)
                if lend is not None:
                    lend(self, nbytes)
                else:
                    account.take(nbytes)
        self.held += nbytes

    def queue(self, window: int, nbytes: int, refusable: bool) -> str | None:
        """A message of ``nbytes`` is to be queued downstream by a session whose window
        and unsent bytes are ``window`` now: the account learns what changed since
        (evictions, writes), then, unless a ``refusable`` (data) message would take the
        user or the worker over budget (returned: why), counts the message. (The queue
        asks only for data messages: control messages are never refused, and what they
        add is in ``window`` the next time.) Within a lent slice, only the meter
        changes."""
        left = self.spare - (window + nbytes - self.window)
        if 0 < left <= self.cap:
            self.spare = left
            self.window = window + nbytes
            return None
        account = self.account
        if account is None:
            self.window = window + nbytes
            return None
        if self.cap:  # past the slice either way: the spare goes back, then as without
            account.repay(self, 0)  # type: ignore[attr-defined]
        why = account.queued(window - self.window, nbytes, refusable)
        self.window = window + nbytes if why is None else window
        return why

    def release(self, nbytes: int) -> None:
        if nbytes:
            self.held -= nbytes
            spare = self.spare + nbytes
            if spare <= self.cap:  # kept in the slice
                self.spare = spare
                return
            account = self.account
            if account is not None:
                if self.cap:
                    self.spare = spare
                    account.repay(self, self.cap // 2)  # type: ignore[attr-defined]
                else:
                    account.give(nbytes)


#: Objects of a value walked one by one (a few milliseconds of the worker at most); a
#: value with more is charged an upper bound from its JSON size instead, so that a
#: message of 330,000 ``{}`` (1 MB) costs one C-speed encoding, not a second of walking.
WALK_LIMIT = 4096
#: The most ``memory_of`` can find per byte of a value's JSON: ``{"":{"":...}}`` nests a
#: one-key dict (184 + 49 bytes) every 5 bytes (46.6); a list of ``{"":0}`` costs 38.4,
#: of ``{}`` 24, of ``"a"`` 14.5, of text about 1 (4 with an emoji).
JSON_FACTOR = 48


def memory_of_walk(value: Any) -> int:
    """What a decoded JSON value costs in memory: ``sys.getsizeof`` of every object in it
    (a dict's keys included). A list of 330,000 ``{}`` is 1 MB of JSON and 24 MB of
    Python objects; a string with one emoji costs 4 bytes a character. Objects Python
    shares (small ints, cached strings) are counted each time they appear: an upper
    bound. Beyond WALK_LIMIT objects: JSON_FACTOR bytes a byte of its JSON, a bound too.
    ``memory_of``'s definition."""
    size = 0
    stack = [value]
    pop, extend = stack.pop, stack.extend
    walked = 0
    while stack:
        item = pop()
        size += getsizeof(item)
        walked += 1
        kind = type(item)
        if kind is dict:
            for key in item:
                size += getsizeof(key)
            extend(item.values())
        elif kind is list:
            extend(item)
        if walked > WALK_LIMIT:
            # default=str: an application's own call may pass what JSON cannot hold
            return JSON_FACTOR * len(orjson.dumps(value, default=str))
    return size


#: A dict of at most this many keys is counted by ``memory_of_flat`` without the stack
#: (far under WALK_LIMIT, so the walk would never have given up on it)
FLAT_KEYS = 32
#: What an ASCII ``str`` costs beyond its characters (``sys.getsizeof("")``: 49 bytes on
#: Python 3.11, 41 from 3.12): one of n ASCII characters costs this plus n, one byte a
#: character and the terminating NUL being in it
ASCII_STR = getsizeof("")
#: What ``getsizeof`` adds to a dict's own ``__sizeof__`` (the garbage collector's
#: header, which every dict has)
DICT_GC = getsizeof({}) - {}.__sizeof__()


def memory_of_flat(value: Any) -> int:
    """``memory_of_walk``, the same number, for the common value (a tool call's params: a
    small dict of strings and numbers) counted in one pass without the walk's stack; any
    other value (a nested one, a list, a scalar) is walked. Each call's params are
    charged (docs/PERFORMANCE.md, "The tool row within 5%"): the walk of an echo's one
    key cost 0.7 µs, this 0.45. An ASCII ``str`` (a key, a value) is counted as
    ``ASCII_STR`` plus its length, ``getsizeof``'s own number for it without its call
    (about 1,400 instructions each: the tool row, branch tool7), the dict as its
    ``__sizeof__()`` plus DICT_GC (``getsizeof``'s number again, for a fifth of the
    cost); any other object by ``getsizeof``.

    Not the params' JSON length either, though the frame's size is known: a byte of JSON
    may cost up to JSON_FACTOR bytes of memory, so only JSON_FACTOR times the length is a
    bound, and that would charge an echo's params 1.7 kB instead of the 309 they hold,
    refusing a user's calls five times sooner."""
    if type(value) is dict and len(value) <= FLAT_KEYS:
        size = value.__sizeof__() + DICT_GC
        for key, item in value.items():
            kind = type(item)
            if kind is str and item.isascii():
                size += ASCII_STR + len(item)
            elif kind is dict or kind is list:
                return memory_of_walk(value)
            else:
                size += getsizeof(item)
            if type(key) is str and key.isascii():
                size += ASCII_STR + len(key)
            else:
                size += getsizeof(key)
        return size
    return memory_of_walk(value)


#: the swap point: every charge takes it (tests/core/test_meter.py runs the same values
#: over both)
memory_of = memory_of_flat
