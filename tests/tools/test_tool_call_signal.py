"""The ``toolCall`` signal of a client's call, on the server's own emit
(``signals.emit`` bound to its sender): with nobody listening the dispatcher does not
call it (it would return at once), but whether anybody listens is asked at each call, so
a receiver connected between two calls hears the second, and one disconnected hears no
more. Any other emit (a test's recorder) is called for every call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from protoflask import ProtoServer, signals
from protoflask.live import LiveSession
from tests.engine.test_engine import SECRET, Harness


class OnSignals(Harness):
    """The engine on the server's wiring of its signals (server.py), this the sender."""

    def __init__(self) -> None:
        self.emit = partial(signals.emit, self)  # type: ignore[method-assign]
        super().__init__()


@contextmanager
def nobody_listening(signal: Any) -> Iterator[None]:
    """``signal`` without its receivers for a while: the signals are the process's, and a
    ``ProtoServer.on`` of an earlier test keeps its receiver (``weak=False``, its sender
    that server), so in the whole suite ``toolCall`` is never without one."""
    saved = (dict(signal.receivers), {k: set(v) for k, v in signal._by_sender.items()},
             {k: set(v) for k, v in signal._by_receiver.items()})
    for table in (signal.receivers, signal._by_sender, signal._by_receiver):
        table.clear()
    try:
        yield
    finally:
        for table, kept in zip((signal.receivers, signal._by_sender, signal._by_receiver),
                               saved, strict=True):
            table.clear()
            table.update(kept)


def call(h: Harness, live: LiveSession, call_id: str) -> str:
    h.send(live, "TOOL_CALL", {"call_id": call_id, "tool": "echo",
                               "params": {"message": call_id}}, "USER")
    (done,) = [m for m in h.written(live) if m["type"] == "TOOL_DONE"]
    assert done["payload"]["call_id"] == call_id
    return str(done["payload"]["status"])


def test_a_receiver_connected_between_calls_hears_the_next_only_while_connected() -> None:
    h = OnSignals()
    assert h.engine.dispatcher._emit_unheard is False  # the skip is in use
    live, _ = h.connect()
    h.hello(live)
    h.written(live)
    heard: list[tuple[Any, str, str, str]] = []

    def receiver(sender: Any, session_id: str, execution: Any) -> None:
        heard.append((sender, session_id, execution.call_id, execution.status))

    with nobody_listening(signals.tool_call):
        assert not signals.tool_call.receivers
        assert call(h, live, "before") == "OK"
        signals.tool_call.connect(receiver)
        try:
            assert call(h, live, "while") == "OK"
            assert call(h, live, "again") == "OK"
        finally:
            signals.tool_call.disconnect(receiver)
        assert call(h, live, "after") == "OK"
    assert heard == [(h, live.core.id, "while", "pending"), (h, live.core.id, "again", "pending")]


def test_another_emit_is_called_for_every_call() -> None:
    h = Harness()  # records every signal, listened to or not
    assert h.engine.dispatcher._emit_unheard is True
    live, _ = h.connect()
    h.hello(live)
    h.written(live)
    assert call(h, live, "a") == "OK" and call(h, live, "b") == "OK"
    assert [kw["execution"].call_id for kw in h.fired(signals.tool_call)] == ["a", "b"]


def test_the_server_wires_the_signals_own_emit() -> None:
    server = ProtoServer({"jwtSecret": SECRET, "enableLogging": False})
    assert server.engine.dispatcher._emit_unheard is False
