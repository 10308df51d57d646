"""The one way a lower layer tells an upper one that something waits for it, without
calling it: a ``Bell``. ``ring`` hands the upper layer's ``answer`` to gevent's event
loop, which runs it on a stack of its own, so no frame of a lower layer is ever under an
upper layer's: the upper layer then pulls what waits (as websockets' I/O loop pulls
``events_received()`` and ``data_to_send()``). A session rings its writer's bell
(``live.py``), a port's write-behind stage rings it when the journal has a batch, a tool
runner rings the session layer's when a call ended (``tool_runner.py``); a cluster's listener
has the session layer settle a session it applied another node's operation to
(``apart``: in a greenlet of its own, as acting on events may block).
"""

from __future__ import annotations

from typing import Any, Callable

from gevent import get_hub, getcurrent, spawn_raw


def soon(fn: Callable[..., None], *args: Any) -> None:
    """Have the event loop call ``fn(*args)`` soon, on a stack of its own (see the module
    doc): the one primitive a ``Bell`` rings with."""
    get_hub().loop.run_callback(fn, *args)


def apart(fn: Callable[..., None], *args: Any) -> None:
    """Have ``fn(*args)`` run soon in a greenlet of its own: for an answer that may block
    (Redis, an application's signal receiver), which the event loop's own stack must
    not run."""
    spawn_raw(fn, *args)


class Bell:
    """``ring``: have the event loop run ``answer`` soon (see the module doc), on its own
    stack, or with ``apart`` in a greenlet of its own (an answer that may block). A ring
    from the ``puller`` greenlet is dropped: that greenlet pulls after each call it makes
    (a WebSocket's reader writes what is ready after each read).

    With a ``subject``, ``answer`` and ``wanted`` are functions of it, called with it
    (``answer(subject)``): a class's function and the instance, where a bound method
    would be one more object kept for as long as the bell (a port's bell lives as long
    as its connection: docs/PERFORMANCE.md, "Fewer objects per session")."""

    __slots__ = ("answer", "puller", "apart", "wanted", "subject")

    def __init__(self, answer: Callable[..., None], puller: Any = None, *,
                 apart: bool = False, wanted: Callable[..., bool] | None = None,
                 subject: Any = None) -> None:
        #: what the upper layer does when rung (without ``apart`` it must not block)
        self.answer = answer
        #: the greenlet that pulls after each of its calls, or None
        self.puller = puller
        self.apart = apart
        #: whether there is anything for the answer to pull (None: always), asked after
        #: the puller test, which is the cheaper one
        self.wanted = wanted
        #: what ``answer`` and ``wanted`` are called with (None: nothing)
        self.subject = subject

    def ring(self) -> None:
        if self.puller is not None and getcurrent() is self.puller:
            return
        subject = self.subject
        if subject is None:
            if self.wanted is not None and not self.wanted():
                return
            if self.apart:
                spawn_raw(self.answer)
            else:
                soon(self.answer)
            return
        if self.wanted is not None and not self.wanted(subject):
            return
        if self.apart:
            spawn_raw(self.answer, subject)
        else:
            soon(self.answer, subject)

    def ring_anyway(self) -> None:
        """``ring`` without asking ``wanted`` (the puller's rings still dropped): for a
        waker that knows there is something to pull which ``wanted`` does not see."""
        if self.puller is not None and getcurrent() is self.puller:
            return
        args = () if self.subject is None else (self.subject,)
        if self.apart:
            spawn_raw(self.answer, *args)
        else:
            soon(self.answer, *args)


def _nothing() -> None:
    return None


#: rings no one (a port before its writer attached)
SILENT = Bell(_nothing)
