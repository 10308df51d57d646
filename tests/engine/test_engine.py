"""The engine on its own: a LocalHub, real core sessions and real tools, a fake transport
that records, and recording callables where the server would be. No ProtoServer, no
sockets."""

from __future__ import annotations

import json
from typing import Any

import gevent
import gevent.event
import pytest

from protoflask import signals
from protoflask.auth import authority_from_config
from protoflask.config import ServerConfig
from protoflask.engine import Engine
from protoflask.clock import now_ms
from protoflask.hub import LocalHub, SessionHost
from protoflask.bell import Bell
from protoflask.live import LiveSession
from protoflask.tools import Tool, ToolExecution, ToolRegistry, builtin_tools

SECRET = "test-secret-that-is-long-enough-for-hs256!"


class FakeTransport:
    kind = "websocket"

    def __init__(self) -> None:
        self.wakes = 0
        self.bell = Bell(self.wake)  # the loop runs wake: count after a turn (gevent.sleep(0))
        self.closed: list[tuple[int, str]] = []

    def wake(self) -> None:
        self.wakes += 1

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))


class BindingHub(LocalHub):
    """A LocalHub that keeps what the engine bound it to."""

    host: SessionHost | None = None

    def bind(self, host: SessionHost) -> None:
        self.host = host


class Harness:
    def __init__(self, **config: Any) -> None:
        self.config = ServerConfig.load({"jwtSecret": SECRET, **config}, environ={})
        self.hub = BindingHub()
        self.tools = ToolRegistry()
        for tool in builtin_tools():
            self.tools.register(tool)
        self.signals: list[tuple[Any, dict[str, Any]]] = []
        self.errors: list[tuple[BaseException, dict[str, Any]]] = []
        self.invoked: list[tuple[str, str, str]] = []
        self.engine = Engine(self.config, self.hub, self.tools,
                             authority_from_config(self.config), emit=self.emit,
                             emit_error=self.emit_error, tool_context="the-server")
        self.seq = 0

    def emit(self, signal: Any, **kwargs: Any) -> None:
        self.signals.append((signal, kwargs))

    def emit_error(self, exc: BaseException, **kwargs: Any) -> None:
        self.errors.append((exc, kwargs))

    def invoke(self, params: Any, session_id: str, call_id: str, server: Any) -> Any:
        """A tool's execute that records what it was called with."""
        self.invoked.append(("echo", session_id, call_id, server))
        return {"echoed": params["message"]}

    def connect(self, user: str = "u1") -> tuple[LiveSession, FakeTransport]:
        live = self.engine.new_session(user)
        transport = FakeTransport()
        self.engine.attach(live, transport)
        return live, transport

    def send(self, live: LiveSession, mtype: str, payload: Any, channel: str) -> None:
        self.seq += 1
        self.engine.receive(live, json.dumps({
            "id": f"c-{self.seq}", "session": live.id, "seq": str(self.seq),
            "ts": str(now_ms()), "type": mtype, "channel": channel, "payload": payload}))

    def hello(self, live: LiveSession) -> None:
        self.send(live, "HELLO", {"proto_version": "1.1.2", "accept_major": [1],
                                  "accept_events": []}, "SYSTEM")

    def written(self, live: LiveSession) -> list[dict[str, Any]]:
        return [json.loads(data) for _, data in live.take_writable(now_ms())]

    def fired(self, signal: Any) -> list[dict[str, Any]]:
        return [kw for s, kw in self.signals if s is signal]


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_the_engine_hands_the_hub_a_session_host(h: Harness) -> None:
    host = h.hub.host
    assert host is not None and host.settings is h.engine.settings
    live = host.adopt(h.engine.new_session("u1").core)
    assert live.runner is None  # built on the session's first tool call
    assert h.engine.tool_runner(live) is live.runner is not None
    assert live.core.traffic is h.engine.stats.traffic
    assert host.local_stats()["totalMessages"] == host.local_stats()["errorsSent"] == 0


def test_hello_is_answered_and_signalled(h: Harness) -> None:
    live, transport = h.connect()
    assert h.fired(signals.connect) == [{"session_id": live.id}]
    h.hello(live)
    assert [m["type"] for m in h.written(live)] == ["HELLO"]
    (handshake,) = h.fired(signals.handshake)
    assert handshake["session_id"] == live.id
    assert handshake["payload"]["proto_version"] == "1.1.2"
    gevent.sleep(0)  # the rung bells answered
    assert transport.wakes >= 1 and h.engine.stats.total_messages == 1


def test_a_tool_call_runs_the_tool_with_the_servers_context(h: Harness) -> None:
    h.tools.register(Tool("echo", "records", {"type": "object"}, execute=h.invoke,
                          inline=True))
    live, _ = h.connect()
    h.hello(live)
    h.written(live)
    h.send(live, "TOOL_CALL", {"call_id": "k1", "tool": "echo", "params": {"message": "hi"}},
           "USER")
    (call,) = h.fired(signals.tool_call)
    assert call["session_id"] == live.id and call["execution"].call_id == "k1"
    assert h.invoked == [("echo", live.id, "k1", "the-server")]
    done = [m for m in h.written(live) if m["type"] == "TOOL_DONE"]
    assert [m["payload"] for m in done] == [
        {"call_id": "k1", "status": "OK", "result": {"echoed": "hi"}}]
    assert h.engine.stats.tools.calls == {("echo", "completed"): 1}


def test_a_call_of_an_unknown_tool_fails_without_a_signal(h: Harness) -> None:
    live, _ = h.connect()
    h.hello(live)
    h.written(live)
    h.send(live, "TOOL_CALL", {"call_id": "k1", "tool": "nope", "params": {}}, "USER")
    assert h.fired(signals.tool_call) == [] and h.invoked == []
    (done,) = [m for m in h.written(live) if m["type"] == "TOOL_DONE"]
    assert done["payload"]["status"] == "ERROR"
    assert done["payload"]["error"]["code"] == "TOOL_NOT_FOUND"


def test_a_tool_that_raises_reaches_emit_error(h: Harness) -> None:
    boom = RuntimeError("boom")

    def execute(*_: Any) -> None:
        raise boom

    h.tools.register(Tool("bad", "raises", {"type": "object"}, execute=execute, inline=True))
    live, _ = h.connect()
    h.hello(live)
    h.send(live, "TOOL_CALL", {"call_id": "k1", "tool": "bad", "params": {}}, "USER")
    assert h.errors == [(boom, {"session_id": live.id})]


def test_run_cancel_cancels_the_runs_tool_call(h: Harness) -> None:
    release = gevent.event.Event()
    h.tools.register(Tool("slow", "waits", {"type": "object"},
                          execute=lambda *_: release.wait() and {}))
    live, _ = h.connect()
    h.hello(live)
    h.send(live, "RUN_STARTED", {"run_id": "r1"}, "AGENT")
    h.send(live, "TOOL_CALL", {"call_id": "k1", "tool": "slow", "params": {},
                               "run_id": "r1"}, "USER")
    gevent.sleep(0)
    assert live.runner is not None and list(live.runner.running) == ["k1"]
    h.written(live)
    h.send(live, "RUN_CANCEL", {"run_id": "r1"}, "USER")
    assert live.runner.running == {}
    (cancelled,) = h.fired(signals.run_cancelled)
    assert cancelled["session_id"] == live.id and cancelled["run"].run_id == "r1"
    done = [m["payload"] for m in h.written(live) if m["type"] == "TOOL_DONE"]
    assert done == [{"call_id": "k1", "status": "CANCELLED"}]
    assert h.engine.stats.runs["cancelled"] == 1
    assert h.engine.stats.tools.calls == {("slow", "cancelled"): 1}


def test_an_application_call_reports_to_on_done(h: Harness) -> None:
    live, _ = h.connect()
    h.hello(live)
    ended: list[tuple[ToolExecution, Any]] = []
    h.engine.call_tool(live, "add", {"a": 1, "b": 2}, "agent-1", None,
                       on_done=lambda e, err: ended.append((e, err)))
    ((execution, error),) = ended
    assert error is None and execution.result == {"result": 3}
    assert h.fired(signals.tool_call) == []  # that event is for the client's calls


def test_a_superseded_transport_is_closed_and_detach_keeps_the_session(h: Harness) -> None:
    live, first = h.connect()
    second = FakeTransport()
    h.engine.attach(live, second)
    assert first.closed == [(4002, "superseded by a resumed connection")]
    h.engine.detach(live, first)  # no longer its transport: nothing happens
    assert live.transport is second
    h.engine.detach(live, second)
    assert live.transport is None and h.hub.get(live.id) is live
    assert h.fired(signals.disconnect) == [{"session_id": live.id}]


def test_kept_sessions_beyond_the_cap_are_dropped_oldest_first() -> None:
    h = Harness(maxKeptSessionsPerUser=1)
    old, old_transport = h.connect()
    new, new_transport = h.connect()
    h.engine.detach(old, old_transport)
    h.engine.detach(new, new_transport)
    assert h.hub.get(old.id) is None and old.core.closed
    assert h.hub.get(new.id) is new


def test_close_transports_closes_every_one_and_keeps_the_sessions(h: Harness) -> None:
    a, ta = h.connect()
    b, tb = h.connect("u2")
    h.engine.close_transports(1001, "closed by server")
    assert ta.closed == tb.closed == [(1001, "closed by server")]
    assert a.transport is None and b.transport is None and len(h.hub) == 2


def _lines(live: LiveSession) -> list[bytes]:
    """Upstream messages of every kind a body can carry, as the lines of an NDJSON body:
    answered, refused, duplicated, unparseable, and one causing events (a tool call)."""
    def env(seq: int, mtype: str, payload: Any, channel: str = "SYSTEM") -> bytes:
        return json.dumps({"id": f"c-{seq}", "session": live.id, "seq": str(seq),
                           "ts": "1", "type": mtype, "channel": channel,
                           "payload": payload}).encode()
    return [b"not json", env(2, "PING", {"nonce": "a"}), env(3, "PING", {}),
            env(3, "PING", {"nonce": "b"}), env(4, "NO_SUCH_TYPE", {}), b'["an", "array"]',
            env(5, "TOOL_CALL", {"call_id": "k1", "tool": "no_such_tool", "params": {}},
                "USER"),
            env(6, "TOOL_CALL", {"call_id": "k2", "tool": "echo", "params": {"x": 1}},
                "USER"),
            env(7, "PING", {"nonce": "c"})]


def _seen(h: Harness, live: LiveSession, transport: FakeTransport) -> Any:
    def plain(value: Any) -> Any:  # the session's own id and clocks differ between runs
        text = json.dumps(value, sort_keys=True, default=repr).replace(live.id, "<sid>")
        return json.loads(text)
    written = [{k: v for k, v in m.items() if k not in ("id", "ts")} for m in h.written(live)]
    stats = h.engine.stats
    gevent.sleep(0)  # the rung bells answered
    return (plain(written), plain([(s.name, kw) for s, kw in h.signals]), transport.wakes,
            stats.total_messages, stats.errors_sent, dict(stats.errors_by_code))


def test_a_body_means_what_its_messages_mean_one_by_one() -> None:
    """receive_body hands decoded lines to the session with receive's own steps: same
    replies, signals, wakes and counts as the same lines received one by one."""
    one, body = Harness(), Harness()
    results = []
    for h, as_body in ((one, False), (body, True)):
        live, transport = h.connect()
        h.hello(live)
        h.written(live)
        h.signals.clear()
        transport.wakes = 0
        lines = _lines(live)
        if as_body:
            assert h.engine.receive_body(live, b"\n".join(lines) + b"\n") == len(lines)
        else:
            for line in lines:
                h.engine.receive(live, line)
        results.append(_seen(h, live, transport))
    assert results[0] == results[1]
    written = results[0][0]
    assert [m["type"] for m in written].count("PONG") == 2 and \
        any(m["type"] == "ERROR" for m in written) and \
        any(m["type"] == "TOOL_DONE" for m in written)


def test_the_engine_leaves_the_gc_policy_to_the_serving_glue(h: Harness) -> None:
    """gc.freeze() is the serving process's (serving.freeze_startup_heap): starting the
    engine's timers freezes nothing (it did, from ensure_running, before the policy moved)."""
    import gc
    gc.unfreeze()
    try:
        h.engine.ensure_running()
        assert gc.get_freeze_count() == 0
    finally:
        h.engine.stop_timers()


class _Clock:
    """A wall clock that moves 3.5 ms a reading (ns)."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000_000_000_000  # 2001: long before any real reading here

    def __call__(self) -> int:
        self.ns += 3_500_000
        return self.ns


@pytest.mark.parametrize("receive", ["receive_plain", "receive_fast"])
class TestReceive:
    """``Engine.receive``'s swap point: the clock read through ``clock.now_ms`` (plain) or
    inline (fast) means the same replies, signals, wakes, counts and recorded times."""

    def run(self, receive: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        import time

        import protoflask.engine

        h = Harness()
        live, transport = h.connect()
        h.hello(live)
        h.written(live)
        h.signals.clear()
        clock = _Clock()
        monkeypatch.setattr(time, "time_ns", clock)  # clock.now_ms reads it
        monkeypatch.setattr(protoflask.engine, "now_ns", clock)
        for line in _lines(live):
            getattr(h.engine, receive)(live, line)
        monkeypatch.undo()
        # the seconds the fake clock read (the HELLO's took real time: not compared)
        buckets = [b for b in h.engine.stats._buckets if b[0] < 1_500_000_000]
        return _seen(h, live, transport), buckets, clock.ns

    def test_means_what_the_plain_path_means(self, receive: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        assert self.run(receive, monkeypatch) == self.run("receive_plain", monkeypatch)

    def test_the_fast_one_is_in_use(self, receive: str) -> None:
        assert Engine.receive is Engine.receive_fast
