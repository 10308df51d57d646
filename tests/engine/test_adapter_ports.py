"""What the adapters (agui/, mcp/) are given of the session layer (adapter_ports.py, the
port's ``AdapterPorts``), on a real engine: a new session meets the memory budget like a
transport's and a refused one leaves nothing counted; a session handed out replays
nothing unless told to; the connection count of a port that takes over another's; the
views of a session held here or not; a call run here for a session elsewhere reports
through the hub's typed operations."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from protoflask.adapter_ports import AdapterGate
from protoflask.core.errors import (
    MaxConnections, SessionNotFound, ToolExecutionError, UserConnectionLimit,
)
from protoflask.live import FailCall, OpenCall, Operation, ToolDone, ToolUpdate
from protoflask.port import AdapterPorts
from protoflask.tool_runner import Report

from .test_engine import Harness

KB = 1000


def gate_of(h: Harness) -> AdapterPorts:
    return AdapterGate(h.engine)  # typed as the adapters see it: the port's protocol


def test_a_new_session_meets_the_memory_budget_and_a_refusal_leaves_no_count() -> None:
    h = Harness(maxUserBytes=300 * KB)
    gate = gate_of(h)
    first = gate.create("u1", "mcp", connect=True)
    h.engine.budget.accounts["u1"].window = 400 * KB  # the user's sessions hold too much
    before = h.engine.stats.active_connections
    with pytest.raises(UserConnectionLimit):
        gate.create("u1", "mcp", connect=True)
    with pytest.raises(UserConnectionLimit):
        gate.create("u1", "agui", "thread-session")
    assert h.engine.stats.active_connections == before  # the refused one gave its slot back
    assert [live.id for live in h.hub.sessions()] == [first.id]
    assert gate.create("u2", "mcp").user_id == "u2"  # another user is not held to it


def test_create_with_connect_counts_before_making_the_session() -> None:
    h = Harness(maxConnections=1)
    gate = gate_of(h)
    gate.create("u1", "mcp", connect=True)
    with pytest.raises(MaxConnections):
        gate.create("u1", "mcp", connect=True)
    assert len(h.hub.sessions()) == 1  # no session made for a connection refused


def test_a_session_handed_out_replays_nothing_unless_told() -> None:
    h = Harness()
    live, _ = h.connect("u1")
    h.hello(live)
    welcomed = h.written(live)  # the WELCOME written, then the transport gone
    h.engine.detach(live, live.transport)
    gate = gate_of(h)
    port = gate.session(live.id, "u1", "mcp")
    assert port.last_seq is None and port.kind == "mcp" and not port.attached
    with pytest.raises(SessionNotFound):
        gate.session(live.id, "u2", "mcp")
    with pytest.raises(SessionNotFound):
        gate.held(live.id, "u2", "mcp")
    assert gate.held("elsewhere", "u1", "mcp") is None
    port.attach(Writer())
    assert port.take() == []  # an MCP link is replayed nothing on attach
    again = gate.session(live.id, "u1", "agui")
    again.last_seq = 0  # an AG-UI stream replays from where its run started
    again.attach(Writer())
    assert [orjson.loads(m)["type"] for _, m in again.take()] == \
        [m["type"] for m in welcomed]


class Writer:
    kind, reader = "mcp", None

    def wake(self) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        pass


def test_a_port_that_takes_over_a_live_transport_is_not_counted_twice() -> None:
    h = Harness(maxConnectionsPerUser=1)
    gate = gate_of(h)
    live, _ = h.connect("u1")
    h.engine.open_connection("websocket", "u1")  # the transport's own slot
    port = gate.session(live.id, "u1", "agui")
    assert gate.serving(port) is None  # the fake transport is not a port
    gate.connect(port)  # replacing: within the user's cap of one
    gate.disconnect(port)
    h.engine.detach(live, live.transport)
    with pytest.raises(UserConnectionLimit):
        gate.connect(gate.session(live.id, "u1", "agui"))


def test_the_views_of_a_session_held_here_and_gone() -> None:
    h = Harness()
    gate = gate_of(h)
    port = gate.create("u1", "agui", "t1")
    here = gate.here("t1")
    assert here is not None and here.id == "t1" and gate.is_current(port)
    gate.start_run(port, "r1", "thread", {"k": 1})
    assert gate.state(port).runs["r1"].status == "active"
    assert gate.node_id is None and gate.other_live_nodes is None and gate.lookup("t1") is None
    h.hub.remove("t1")
    assert gate.here("t1") is None and not gate.is_current(port)


class Recording:
    """The hub's deliver, recorded: what a call run here for a session elsewhere sends."""

    def __init__(self, h: Harness) -> None:
        self.sent: list[tuple[str, Operation]] = []
        h.hub.deliver = self.deliver  # type: ignore[method-assign]

    def deliver(self, session_id: str, op: Operation) -> bool:
        self.sent.append((session_id, op))
        return True


def test_a_call_elsewhere_opens_and_reports_through_the_hubs_operations() -> None:
    h = Harness()
    gate = gate_of(h)
    sent = Recording(h).sent
    error = ToolExecutionError("it failed")
    assert gate.open_call("s", "c1", "r1")
    for report in (Report("update", "c1", "QUEUED"), Report("done", "c1", "OK", {"a": 1}),
                   Report("fail", "c1", error=error)):
        assert gate.report("s", report)
    assert sent == [("s", OpenCall("c1", "r1")), ("s", ToolUpdate("c1", "QUEUED")),
                    ("s", ToolDone("c1", "OK", {"a": 1})), ("s", FailCall("c1", error))]


def test_a_session_gone_is_false_not_an_error() -> None:
    h = Harness()
    gate = gate_of(h)
    assert gate.open_call("nobody", "c1", None) is False
    out: Any = object()
    assert gate.send("nobody", out) is False
