"""The cluster's pieces that need no Redis: statistics, session fields, tool calls of
nodes that may be gone (over a store that is a dict)."""

from __future__ import annotations

from typing import Any

import orjson

from protoflask.cluster.calls import RemoteCalls
from protoflask.cluster.keys import pack_entry, unpack_entry
from protoflask.cluster.nodes import aggregate_stats, node_meta, session_fields
from protoflask.core.handoff import export_state
from protoflask.live import LiveSession

from ..core._support import Client
from .test_local_hub import live_session


def report(node: str, messages: int, rate: float, latency: float, errors: int) -> dict[str, Any]:
    return {"node": node, "totalConnections": 2, "activeConnections": 1,
            "totalMessages": messages, "messagesPerSecond": rate, "averageLatency": latency,
            "errorRate": 0.0, "uptime": 5, "errorsSent": errors}


def test_aggregate_sums_counts_and_weighs_latency() -> None:
    stats = aggregate_stats([report("a", 100, 1.0, 10.0, 1), report("b", 300, 3.0, 2.0, 3)])
    assert stats["totalConnections"] == 4 and stats["totalMessages"] == 400
    assert stats["messagesPerSecond"] == 4.0
    assert stats["averageLatency"] == 4.0  # (10*1 + 2*3) / 4
    assert stats["errorRate"] == 0.01
    assert stats["uptime"] == 5 and [n["node"] for n in stats["nodes"]] == ["a", "b"]


def test_node_meta() -> None:
    live = live_session()
    meta = node_meta("n1", [live], 7)
    assert meta["node"] == "n1" and meta["sessions"] == 1 and meta["connectedSessions"] == 1
    assert meta["errorsSent"] == 7


def test_session_fields_of_a_record() -> None:
    live = live_session()
    record = {b"node": b"n2", b"connected": b"1", b"state": orjson.dumps(export_state(live.core))}
    fields = session_fields(live.id, record, alive=True)
    assert fields["id"] == live.id and fields["userId"] == "user-1"
    assert fields["connected"] is True and fields["node"] == "n2"
    assert session_fields(live.id, record, alive=False)["node"] is None


def test_replay_entries_pack_and_unpack() -> None:
    assert unpack_entry(pack_entry(7, 1234, b"a b\nc")) == (7, 1234, b"a b\nc")


class DictStore:
    node_id = "here"

    def __init__(self, alive: set[str]) -> None:
        self.alive = alive
        self.calls_on: dict[str, dict[str, str]] = {}

    def node_alive(self, node: str) -> bool:
        return node in self.alive

    def set_calls_on(self, session_id: str, remote: dict[str, str]) -> None:
        self.calls_on[session_id] = dict(remote)


def open_calls(live: LiveSession, *call_ids: str) -> None:
    client = Client(live.core)
    client.seq = 1  # after the HELLO
    for call_id in call_ids:
        client.send("TOOL_CALL", {"call_id": call_id, "tool": "echo", "params": {}})


def test_calls_of_a_lost_node_end_and_live_ones_are_watched() -> None:
    live = live_session()
    open_calls(live, "lost", "running")
    assert set(live.core.calls) == {"lost", "running"}
    store = DictStore(alive={"b"})
    cancelled: list[tuple[str, str]] = []
    calls = RemoteCalls(store, {live.id: live}.get,  # type: ignore[arg-type]
                        lambda sid, cid: cancelled.append((sid, cid)))
    calls.adopt(live, "a", {"running": "b"})
    assert set(live.core.calls) == {"running"}  # "lost" ran on a, which is gone
    assert cancelled == [(live.id, "lost")]
    assert calls.remote == {live.id: {"running": "b"}}
    assert store.calls_on[live.id] == {"running": "b"}
    store.alive.clear()  # b dies before it reports
    calls.watch()
    assert live.core.calls == {} and calls.remote == {} and store.calls_on[live.id] == {}
