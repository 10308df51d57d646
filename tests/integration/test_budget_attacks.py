"""One user with one token tries to make a worker hold more than its budget (issue 24):
tool calls whose params are lists of ``{}`` (3 bytes of JSON, about 70 bytes of memory
each: 150 kB on the wire, 3.6 MB held until the call's TOOL_DONE), runs with large
metadata and texts with an emoji (4 bytes a character), from several sessions at once,
disconnected ones included; with maxUserBytes 8 MiB and memoryCeiling 24 MiB.

What must hold, embedded and under gunicorn: every call the attacker sends ends in
exactly one TOOL_DONE (OK, or ERROR MAX_RUNS_EXCEEDED when it would take the user over:
nothing dropped in silence); the user's held bytes (the budget's running count) never
read above maxUserBytes; the worker stays up with its RSS grown by far less than the
attack sent; a bystander's tool call, text and PING, started before the attack, all
complete. The tiny-element body and resume churn are tests/integration/test_body_slices.py
and test_resume_churn.py; refusals and shedding for texts test_user_budget.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..hardening_support import Live, answers, vitals
from ..support import WSClient, timeout, wait_for

MIB = 1 << 20
BUDGET = 8 * MIB
PAD = [{}] * 50_000  # 150 kB of JSON


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, maxUserBytes=BUDGET, memoryCeiling=24 * MIB,
                  maxConcurrentRuns=2, toolQueueSize=20, replayWindowTime=60000)
    try:
        yield server
    finally:
        server.stop()


def held_by(live: Live, user: str) -> int:
    return vitals(live.base_url)["heldByUser"].get(user, 0)


def round_trip(client: WSClient, nonce: str) -> None:
    client.send("PING", "SYSTEM", {"nonce": nonce})
    client.recv_type("PONG", within=30, nonce=nonce)


def attack(client: WSClient, prefix: str, calls: int) -> list[str]:
    """``calls`` heavy tool calls, a heavy run and an emoji text; the call ids."""
    ids = [f"{prefix}-{i}" for i in range(calls)]
    for call_id in ids:
        client.send("TOOL_CALL", "AGENT", {"call_id": call_id, "tool": "sleep",
                                           "params": {"seconds": 0.3, "pad": PAD}})
    client.send("RUN_STARTED", "SYSTEM", {"run_id": f"{prefix}-run",
                                          "metadata": {"pad": PAD}})
    client.send("MESSAGE_START", "USER", {"message_id": f"{prefix}-t",
                                          "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": f"{prefix}-t",
                                         "content": "\U0001F600" + "x" * 500_000})
    return ids


def outcomes(client: WSClient, ids: list[str]) -> dict[str, list[Any]]:
    """Every call's TOOL_DONEs (status, error code), read until each has one."""
    done: dict[str, list[Any]] = {call_id: [] for call_id in ids}
    errors: dict[str, str] = {}

    def record(m: dict[str, Any]) -> bool:
        p = m["payload"]
        if m["type"] == "ERROR" and p.get("related_id"):
            errors[p["related_id"]] = p["code"]
        if m["type"] == "TOOL_DONE" and p["call_id"] in done:
            code = (p.get("error") or {}).get("code")
            done[p["call_id"]].append((p["status"], code))
        return all(done.values())

    client.recv_until(record, within=60)
    return done


def test_one_user_cannot_make_the_worker_hold_more_than_the_budget(live):
    attacker, other = live.token("attacker"), live.token("bystander")
    before = vitals(live.base_url)["rss"]
    bystander = WSClient(live.base_url, other)
    bystander.hello()
    bystander.send("TOOL_CALL", "AGENT", {"call_id": "mine", "tool": "sleep",
                                          "params": {"seconds": 1}})
    bystander.send("MESSAGE_START", "USER", {"message_id": "b", "content_type": "text/plain"})
    bystander.send("MESSAGE_PART", "USER", {"message_id": "b", "content": "\u00e9" * 1000})
    sent = 0
    clients = []
    try:
        for round in range(3):
            client = WSClient(live.base_url, attacker)
            clients.append(client)
            client.hello()
            ids = attack(client, f"r{round}", 12)
            sent += 150_000 * 13 + 2_000_000
            done = outcomes(client, ids)
            assert all(len(v) == 1 for v in done.values()), done  # one TOOL_DONE each
            statuses = {v[0] for v in done.values()}
            assert statuses <= {("OK", None), ("ERROR", "MAX_RUNS_EXCEEDED")}, statuses
            assert ("ERROR", "MAX_RUNS_EXCEEDED") in statuses  # the budget refused some
            assert held_by(live, "attacker") <= BUDGET
            round_trip(bystander, f"during-{round}")
            answers(live.base_url, other)
            client.drop()  # kept, holding what it holds: the next session still pays
        now = vitals(live.base_url)
        assert now["heldByUser"].get("attacker", 0) <= BUDGET, now
        assert now["heldBytes"] <= 24 * MIB, now
        # 3 rounds sent ~12 MB of JSON that decoded to ~150 MB of objects
        assert now["rss"] - before < 96 * MIB, (before, now["rss"], sent)
        # nothing of the bystander's was lost
        if not [m for m in bystander.received if m["type"] == "TOOL_DONE"
                and m["payload"]["call_id"] == "mine" and m["payload"]["status"] == "OK"]:
            bystander.recv_type("TOOL_DONE", within=30, call_id="mine", status="OK")
        bystander.send("MESSAGE_END", "USER", {"message_id": "b"})
        echo = bystander.recv_until(lambda m: m["type"] == "MESSAGE_PART", within=30)
        assert echo["payload"]["content"] == "\u00e9" * 1000
        round_trip(bystander, "after")
    finally:
        for client in clients:
            client.close()
        bystander.close()
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, within=timeout(15),
             what="the connections to close")
