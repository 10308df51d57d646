"""The parts a session is made of, each exporting and restoring its own state (what
core.handoff moves between nodes), and the events' one way out."""

from __future__ import annotations

import orjson
import pytest

from protoflask.core import messages
from protoflask.core.calls import CallRegistry
from protoflask.core.credits import CreditLedger
from protoflask.core.errors import (
    CloseCode, DuplicateCallId, InvalidMessage, MaxRunsExceeded, RunNotFound,
)
from protoflask.core.events import RunChanged

from ._support import Client, credit_settings, make_session


def test_close_codes_keep_their_wire_values() -> None:
    assert {c.name: int(c) for c in CloseCode} == {
        "NORMAL": 1000, "GOING_AWAY": 1001, "POLICY_VIOLATION": 1008, "TOO_LARGE": 1009,
        "HEARTBEAT": 4000, "UNSUPPORTED_VERSION": 4001, "SUPERSEDED": 4002,
        "SLOW_CONSUMER": 4003, "MOVED": 4004}
    assert orjson.dumps({"code": CloseCode.SUPERSEDED}) == b'{"code":4002}'


def test_the_call_registry_round_trips_through_json() -> None:
    reg = CallRegistry(max_runs=2)
    reg.add_run("r1", 5, "t", {"k": 1})
    reg.add_call("c1", "r1", "m1")
    reg.add_call("c2", None, None)
    runs, calls = orjson.loads(orjson.dumps(reg.export()))
    copy = CallRegistry(max_runs=2)
    copy.restore(runs, calls)
    assert copy.runs["r1"].to_dict() == reg.runs["r1"].to_dict()
    assert copy.calls == reg.calls


def test_the_call_registry_checks_its_limits() -> None:
    reg = CallRegistry(max_runs=1)
    reg.add_run("r1", 0, None, None)
    with pytest.raises(MaxRunsExceeded):
        reg.check_room()
    with pytest.raises(InvalidMessage):
        reg.add_run("r1", 0, None, None)
    with pytest.raises(RunNotFound):
        reg.add_call("c", "nope", None, check_run=True)
    reg.add_call("c", "r1", None, check_run=True)
    with pytest.raises(DuplicateCallId):
        reg.add_call("c", None, None)
    assert reg.calls_of("r1") == ("c",)
    assert reg.end_run("r1", 9).end_time == 9
    with pytest.raises(RunNotFound):
        reg.end_run("r1", 9)


def test_the_credit_ledger_round_trips_through_json() -> None:
    led = CreditLedger(credit_settings())
    led.announce_client_credit(3, 300, downstream=True)
    led.charge("USER", 100)
    led.spend("AGENT", 50)
    copy = CreditLedger(credit_settings())
    copy.restore(orjson.loads(orjson.dumps(led.export())))
    assert copy.export() == led.export()
    assert copy.upstream() == led.upstream() and copy.downstream() == led.downstream()


def test_events_of_every_origin_come_out_of_one_buffer_in_order() -> None:
    s = make_session()
    c = Client(s)
    c.handshake()
    s.work.start_run(0, run_id="app-run")  # the application's call: its event waits
    events = c.send("RUN_STARTED", {"run_id": "client-run"})  # then a client message
    assert [e.run.run_id for e in events if isinstance(e, RunChanged)] == [
        "app-run", "client-run"]
    assert s.take_events() == [] and not s.has_events()


def test_receive_returns_nothing_and_take_events_drains() -> None:
    s = make_session()
    assert s.receive(b"not json", 0) is None
    assert s.has_events()
    assert len(s.take_events()) == 1
    assert s.tick(0) is None and s.take_events() == []


def test_pending_messages_export_as_plain_data() -> None:
    s = make_session()
    s.outbound.pause_by_client("AGENT")
    s.send(messages.create("NOTE", {"n": 1}, channel="AGENT"))
    assert s.outbound.export_pending() == [
        {"type": "NOTE", "channel": "AGENT", "payload": {"n": 1}}]


def test_taking_the_pending_messages_keeps_the_byte_counts_true() -> None:
    s = make_session()
    s.outbound.pause_by_client("AGENT")
    for n in range(3):
        s.send(messages.create("NOTE", {"n": n}, channel="AGENT"))
    assert s.outbound.pending_bytes > 0
    taken = s.outbound.take_pending()
    assert [ob.payload["n"] for ob in taken] == [0, 1, 2]
    assert not s.pending and s.outbound.pending_bytes == 0 and s.unsent_bytes == 0
    s.send(messages.create("NOTE", {"n": 3}, channel="AGENT"))  # counting starts afresh
    assert len(s.pending) == 1 and s.outbound.pending_bytes > 0
