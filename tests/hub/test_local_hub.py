"""LocalHub and LiveSession on real core sessions, with no server, engine or sockets."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

from protoflask.cluster import make_hub
from protoflask.config import ServerConfig
from protoflask.core import messages
from protoflask.core.errors import SessionNotFound, ToolExecutionError
from protoflask.core.session import ProtocolSession
from protoflask.hub import LocalHub, SessionHost, Upstream, cluster_stats
from protoflask.bell import Bell
from protoflask.live import HELD, IDLE, LiveSession, Operation, Send, Stage, ToolDone
from protoflask.tickets import MemoryTicketStore

from ..core._support import Client


class FakeTransport:
    kind = "websocket"

    def __init__(self) -> None:
        self.wakes = 0
        self.bell = Bell(self.wake)  # the loop runs wake: count after a turn (gevent.sleep(0))
        self.closed: tuple[int, str] | None = None

    def wake(self) -> None:
        self.wakes += 1

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


def live_session(session_id: str = "sess-1", *, handshake: bool = True) -> LiveSession:
    core = ProtocolSession(session_id, "user-1", ServerConfig().session_settings(), 0)
    core.attach(0)
    if handshake:
        Client(core).handshake()
    return LiveSession(core)


def note(text: str = "hi") -> messages.Outbound:
    return messages.create("TEXT", {"text": text}, "USER")


def test_registry() -> None:
    hub = LocalHub()
    a, b = live_session("a"), live_session("b")
    hub.add(a)
    hub.add(b)
    assert len(hub) == 2 and hub.get("a") is a and set(hub.sessions()) == {a, b}
    assert hub.remove("a") is a and hub.get("a") is None and len(hub) == 1
    assert hub.remove("a") is None


def test_deliver_applies_the_operation_and_wakes_the_transport() -> None:
    hub = LocalHub()
    live = live_session()
    live.transport = transport = FakeTransport()
    hub.add(live)
    assert hub.deliver(live.id, Send(note("hello"))) is True
    assert transport.wakes == 0  # rung, not called: the event loop answers the bell
    gevent.sleep(0)
    assert transport.wakes == 1
    written = [data for _, data in live.take_writable(0)]
    assert len(written) == 1 and b'"hello"' in written[0]


def test_deliver_to_an_unknown_session() -> None:
    with pytest.raises(SessionNotFound):
        LocalHub().deliver("nobody", Send(note()))


def test_a_detached_session_stamps_into_its_replay_window() -> None:
    live = live_session()
    live.core.detach(0)
    assert live.send(note()) is True
    assert not live.has_writable()  # stamped already, for a resume
    assert [e.seq for e in live.core.replay][-1] == live.core.downstream_seq


def test_tool_done_for_an_unknown_call_is_false() -> None:
    live = live_session()
    assert live.apply(ToolDone("no-such-call", "OK", {"x": 1})) is False
    assert live.fail_call("no-such-call", ToolExecutionError("bad")) is False


def test_broadcast_reaches_connected_sessions_only() -> None:
    hub = LocalHub()
    on, off = live_session("on"), live_session("off")
    off.core.detach(0)
    hub.add(on)
    hub.add(off)
    assert hub.broadcast(note("all")) == 1


class RecordingLink:
    """What a cluster hub sets on a session it follows, reduced to a record."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.delivered: list[Operation] = []
        self.moved = False
        self.waiting: list[Any] = []  # written_then's continuations, run by the test

    def written(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int) -> bool:
        self.seqs.extend(seq for seq, _ in ready)
        return not self.moved

    def written_then(self, live: LiveSession, ready: list[tuple[int, bytes]], now: int,
                     then: Any) -> bool:
        self.seqs.extend(seq for seq, _ in ready)
        self.waiting.append(then)
        return True

    def deliver(self, live: LiveSession, op: Operation) -> bool:
        self.delivered.append(op)
        return live.run(op)


def test_a_writer_that_need_not_wait_gets_the_messages_once_shared() -> None:
    live = live_session()
    live.transport = FakeTransport()
    live.link = link = RecordingLink()
    live.send(note())
    stage = Stage()
    writer = FakeTransport()
    stage.bell = writer.bell
    stage.state = HELD  # as the port leaves it while the link has the batch
    assert live.take_writable_then(0, stage) is None  # handed to the link
    assert stage.released is None and link.seqs and not live.has_writable()
    assert live.core.outbound.in_flight > 0  # held for the link: counted as being written
    link.waiting.pop()()
    assert stage.released is not None and stage.state == IDLE
    assert [seq for seq, _ in stage.released] == link.seqs  # the same messages, once shared
    assert live.core.outbound.in_flight == 0
    gevent.sleep(0)
    assert writer.wakes == 1  # the stage rang the writer's bell (the loop answered)
    stage.released = None
    link.moved = True
    live.send(note())
    stage.state = HELD
    assert live.take_writable_then(0, stage) is None
    link.waiting.pop()()
    assert stage.released is None  # moved away meanwhile: not this process's to send
    live.link = None
    live.send(note())
    ready = live.take_writable_then(0, stage)  # no link: at once
    assert ready and stage.released is None


def test_a_link_sees_writes_and_deliveries() -> None:
    live = live_session()
    live.transport = FakeTransport()
    live.link = link = RecordingLink()
    live.send(note())
    assert [type(op) for op in link.delivered] == [Send]
    ready = live.take_writable(0)
    assert ready and [seq for seq, _ in ready] == link.seqs
    link.moved = True
    live.send(note())
    assert live.take_writable(0) == []  # moved away meanwhile: not this process's to send


def test_hooks_of_one_process() -> None:
    hub = LocalHub()
    live = live_session()
    hub.add(live)
    assert hub.clustered is False
    assert hub.claim("x", "user-1") is None and hub.lookup("x") is None
    assert hub.route("x", Upstream("user-1", b"{}")) is False
    with pytest.raises(SessionNotFound):
        hub.route("x", Send(note()))
    assert hub.view is None and cluster_stats(hub.view, {"a": 1}) == {"a": 1}
    assert isinstance(hub.tickets, MemoryTicketStore)
    hub.publish({"op": "cancel"})  # nobody else to tell
    hub.remove(live.id, keep=True)
    assert hub.get(live.id) is None


def test_the_cluster_seam_is_eight_methods() -> None:
    """What a cluster hub overrides of LocalHub (docs/ARCHITECTURE.md, "The seams")."""
    from protoflask.cluster.hub import RedisHub

    overridden = {name for klass in RedisHub.__mro__[:-2] for name, value in vars(klass).items()
                  if callable(value) and hasattr(LocalHub, name) and not name.startswith("__")}
    assert overridden == {"start", "stop", "add", "remove", "changed", "route", "publish",
                          "claim"}


def test_bind_keeps_the_host() -> None:
    hub = LocalHub()
    host = SessionHost(settings=ServerConfig().session_settings(), adopt=LiveSession,
                       close_transport=lambda live, code, reason: None,
                       local_stats=lambda: {}, receive_body=lambda live, body: 0)
    hub.bind(host)
    assert hub.host is host


def test_make_hub_without_redis_is_local() -> None:
    assert type(make_hub(ServerConfig())) is LocalHub


def test_pass_throughs_for_transports() -> None:
    live = live_session()
    live.transport = FakeTransport()
    live.send(note())
    assert live.has_writable()
    live.set_in_flight(10)
    assert live.core.outbound.in_flight == 10
