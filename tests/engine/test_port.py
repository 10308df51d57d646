"""The session port's one way of writing (port.py, SessionPort.take): the same messages
in the same order whether a cluster's write-behind stage holds each batch first or not;
nothing written while the stage holds a batch; a closing transport gets what the stage
held, then the rest; a session that moved writes nothing; the translate step on every
batch. Real core sessions; the stage is a link that releases when the test says."""

from __future__ import annotations

from typing import Any, Callable

import gevent
import pytest

from protoflask.core import messages
from protoflask.bell import Bell
from protoflask.live import LiveSession, Operation
from protoflask.port import Limits, SessionPort

from ..hub.test_local_hub import live_session

LIMITS = Limits(65536, 10, 25_000)


class Stage:
    """A SessionLink that holds each batch until ``release`` (or releases at once)."""

    def __init__(self, at_once: bool = False) -> None:
        self.at_once = at_once
        self.moved = False
        self.waiting: list[Callable[[], None]] = []
        self.seqs: list[int] = []

    def written(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int) -> bool:
        self.seqs.extend(seq for seq, _ in ready)
        return not self.moved

    def written_then(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int,
                     then: Callable[[], None]) -> bool:
        self.seqs.extend(seq for seq, _ in ready)
        if self.at_once:
            then()
        else:
            self.waiting.append(then)
        return True

    def deliver(self, live: LiveSession, op: Operation) -> bool:
        return live.run(op)

    def persist(self, live: LiveSession) -> None:
        return None

    def note_state(self, live: LiveSession) -> None:
        return None

    def release(self) -> None:
        waiting, self.waiting = self.waiting, []
        for then in waiting:
            then()


class Writer:
    kind = "websocket"
    reader = None

    def __init__(self) -> None:
        self.wakes = 0
        self.bell = Bell(self.wake)  # as a port's, when this stands for another transport

    def wake(self) -> None:
        self.wakes += 1

    def close(self, code: int, reason: str) -> None:
        pass


class NoEngine:
    def receive(self, live: Any, raw: Any) -> None:
        raise AssertionError("not used here")


def port_of(link: Stage | None) -> tuple[SessionPort, Writer]:
    live = live_session()
    port = SessionPort(NoEngine(), live, None, "websocket", LIMITS)  # type: ignore[arg-type]
    writer = Writer()
    port.bell = Bell(writer.wake)  # what attach does, without the engine (the stage's too)
    live.transport = port
    live.link = link  # type: ignore[assignment]
    return port, writer


def send(port: SessionPort, text: str) -> None:
    port.live.send(messages.create("TEXT", {"text": text}, "USER"))


def texts(batch: list[tuple[int, bytes]]) -> list[str]:
    import orjson

    return [orjson.loads(data)["payload"].get("text", "") for _, data in batch]


@pytest.mark.parametrize("stage", ["none", "at once", "held"])
class TestOneWayOfWriting:
    """The same sequence of sends and takes over no stage, a stage that releases at once
    (a paused journal) and one that holds each batch until released."""

    def writes(self, stage: str) -> list[str]:
        link = None if stage == "none" else Stage(at_once=stage == "at once")
        port, writer = port_of(link)
        out: list[str] = []
        for round_ in range(3):
            send(port, f"a{round_}")
            send(port, f"b{round_}")
            out += texts(port.take())
            if stage == "held":
                assert port.holding and port.take() == []  # nothing while held
                gevent.sleep(0)  # the sends' rings answered
                wakes = writer.wakes
                assert link is not None
                link.release()
                assert writer.wakes == wakes and not port.holding  # rung, not called
                gevent.sleep(0)  # the event loop answers the bell
                assert writer.wakes == wakes + 1
                out += texts(port.take())
        return out

    def test_the_same_messages_in_the_same_order(self, stage: str) -> None:
        assert [t for t in self.writes(stage) if t] == ["a0", "b0", "a1", "b1", "a2", "b2"]

    def test_translate_applies_to_every_batch(self, stage: str) -> None:
        link = None if stage == "none" else Stage(at_once=stage == "at once")
        port, _ = port_of(link)
        port.translate = lambda ready: [(seq, data.upper()) for seq, data in ready]
        send(port, "x")
        batch = port.take()
        if stage == "held":
            assert link is not None
            link.release()
            batch = port.take()
        assert batch and all(data == data.upper() for _, data in batch)


def test_a_closing_transport_gets_the_held_batch_then_the_rest() -> None:
    link = Stage()
    port, _ = port_of(link)
    send(port, "held")
    assert port.take() == [] and port.holding
    send(port, "later")
    link.at_once = True  # the stage releases the held batch while take_final waits
    import gevent

    gevent.spawn_later(0.01, link.release)
    assert [t for t in texts(port.take_final()) if t] == ["held", "later"]


def test_a_session_that_moved_writes_nothing_of_the_held_batch() -> None:
    link = Stage()
    port, _ = port_of(link)
    send(port, "gone")
    assert port.take() == []
    link.moved = True
    link.release()  # LiveSession.take_writable_then hands [] once moved
    assert port.take() == [] and not port.has_writable()


def test_a_superseded_port_takes_nothing_new() -> None:
    port, _ = port_of(None)
    port.live.transport = Writer()  # another transport replaced it
    send(port, "not mine")
    assert port.live.has_writable()  # the other transport's to take
    assert port.take() == [] and not port.attached


@pytest.mark.parametrize("stage", ["none", "held"])
class TestTakeWaiting:
    """``take_waiting`` (the MCP link's take): what is ready, at once, whether or not a
    cluster shares it first; nothing for a port that no longer serves the session or a
    session that moved."""

    def test_everything_ready_in_order_never_through_the_stage(self, stage: str) -> None:
        link = None if stage == "none" else Stage()
        port, _ = port_of(link)
        send(port, "a")
        send(port, "b")
        assert texts(port.take_waiting())[-2:] == ["a", "b"]
        assert not port.holding and port.take_waiting() == []
        if link is not None:
            assert link.waiting == []  # shared (the link's written), not held in the stage

    def test_nothing_for_a_port_no_longer_attached(self, stage: str) -> None:
        port, _ = port_of(None if stage == "none" else Stage())
        send(port, "a")
        port.live.transport = None
        assert port.take_waiting() == []



def test_take_waiting_gives_nothing_for_a_session_that_moved() -> None:
    link = Stage()
    port, _ = port_of(link)
    link.moved = True
    send(port, "a")
    assert port.take_waiting() == []


def test_the_read_only_views_are_the_sessions() -> None:
    port, _ = port_of(None)
    core = port.live.core
    assert port.open_calls is core.calls
    assert port.replay_window is core.replay
    assert port.upstream_seq == 1  # the handshake's HELLO
    send(port, "kept")
    port.take_waiting()  # stamped: in the window until ACKed
    assert any(b'"kept"' in stored.data for stored in port.replay_window)
