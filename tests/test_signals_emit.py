"""``signals.emit``'s own walk of a signal's receivers (the swap point
``signals.RECEIVERS_INLINE``) against blinker's ``receivers_for``: the same receivers
called, in the same order, with the same arguments; a dead weak receiver disconnected;
one disconnected by an earlier receiver not called; a raising one reported on ``error``."""

from __future__ import annotations

import gc
from typing import Any, Callable

import pytest
from blinker import Namespace

from protoflask import signals


class Server:
    """A sender (weakly referable, as the ProtoServer)."""


class Recorder:
    def __init__(self, calls: list[Any], name: str) -> None:
        self.calls, self.name = calls, name

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append((self.name, sender, sorted(kwargs.items())))

    def method(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append((self.name + ".method", sender, sorted(kwargs.items())))


def scenario(setup: Callable[[Any], Any], calls: list[Any], senders: list[Any]
             ) -> tuple[list[Any], int]:
    """Each way, on a new signal with the same receiver objects (``setup`` connects them:
    a set's order follows their ids): the calls made and the receivers left after
    emitting from each sender twice."""
    outcomes = []
    for inline in (True, False):
        signals.RECEIVERS_INLINE = inline
        try:
            signal = Namespace().signal("s")
            calls.clear()
            setup(signal)
            gc.collect()
            for sender in senders + senders:
                signals.emit(sender, signal, session_id="x", n=1)
            outcomes.append((list(calls), len(signal.receivers)))
        finally:
            signals.RECEIVERS_INLINE = True
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


SERVER, OTHER = Server(), Server()


def test_receivers_for_any_for_a_sender_and_bound_methods() -> None:
    calls: list[Any] = []
    strong = [Recorder(calls, f"r{i}") for i in range(6)]

    def setup(signal: Any) -> None:
        for r in strong[:3]:
            signal.connect(r, weak=False)
        signal.connect(strong[3], sender=SERVER, weak=False)
        signal.connect(strong[4], sender=OTHER, weak=False)
        signal.connect(strong[5].method)  # weak, to a bound method of a live object
    done, left = scenario(setup, calls, [SERVER, OTHER, "a name", 7])
    assert len(done) == 2 * (5 + 5 + 4 + 4) and left == 6


def test_a_dead_weak_receiver_is_disconnected_and_not_called() -> None:
    calls: list[Any] = []
    kept = Recorder(calls, "kept")

    def setup(signal: Any) -> None:
        signal.connect(kept)
        signal.connect(Recorder(calls, "gone"))  # weak, dropped at once
    done, left = scenario(setup, calls, [SERVER])
    assert [c[0] for c in done] == ["kept", "kept"] and left == 1


def test_a_receiver_disconnected_by_an_earlier_one_is_not_called() -> None:
    calls: list[Any] = []
    receivers = [Recorder(calls, f"r{i}") for i in range(6)]

    def disconnecting(sender: Any, **kwargs: Any) -> None:
        calls.append(("disconnecting", sender, []))
        for r in receivers:
            signal_now[0].disconnect(r)
    signal_now: list[Any] = [None]

    def setup(signal: Any) -> None:
        signal_now[0] = signal
        for r in receivers[:3]:
            signal.connect(r, weak=False)
        signal.connect(disconnecting, weak=False)
        for r in receivers[3:]:
            signal.connect(r, weak=False)
    done, left = scenario(setup, calls, [SERVER])
    assert left == 1 and done[-1][0] == "disconnecting" and len(done) < 8


def test_a_raising_receiver_is_reported_on_error() -> None:
    reported: list[Any] = []
    calls: list[Any] = []

    def on_error(sender: Any, **kwargs: Any) -> None:
        reported.append((sender, type(kwargs["error"]).__name__, kwargs["session_id"]))

    def raising(sender: Any, **kwargs: Any) -> None:
        calls.append(("raising", sender, []))
        raise ValueError("no")

    signals.error.connect(on_error, weak=False)
    try:
        scenario(lambda signal: signal.connect(raising, weak=False), calls, [SERVER])
    finally:
        signals.error.disconnect(on_error)
    assert reported == [(SERVER, "ValueError", None)] * 4


@pytest.mark.parametrize("inline", [True, False])
def test_the_sender_id_follows_the_sender(inline: bool, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(signals, "RECEIVERS_INLINE", inline)
    signal = Namespace().signal("s")
    calls: list[Any] = []
    one, two = Recorder(calls, "one"), Recorder(calls, "two")
    signal.connect(one, sender=SERVER, weak=False)
    signal.connect(two, sender=OTHER, weak=False)
    for sender in (SERVER, OTHER, SERVER, Server()):
        signals.emit(sender, signal)
    assert [c[0] for c in calls] == ["one", "two", "one"]
