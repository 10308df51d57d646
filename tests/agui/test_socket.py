"""AG-UI events on the native WebSocket (docs/AGUI.md, "AG-UI events on the WebSocket"): a
client that asks for the extension in its HELLO starts runs with a RunAgentInput in a
native RUN_STARTED and gets each run as AG-UI events, one AGUI_EVENT envelope a frame,
every one valid for ag-ui-protocol's models, with native messages around them; a resume
from last_seq gives the rest exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from ..support import WSClient
from .conftest import validate


def socket_client(server: Any, user: str = "ws-user", **query: Any) -> WSClient:
    return WSClient(server.base_url, server.issue_token(user), compression=False, **query)


def agui_hello(client: WSClient) -> dict[str, Any]:
    return client.hello(capabilities={"extensions": ["agui"]})


def start(client: WSClient, run_id: str, text: str | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"threadId": "t1", "runId": run_id, "state": {}, "tools": [],
                            "context": [], "forwardedProps": {},
                            "messages": [] if text is None else
                            [{"id": f"m-{run_id}", "role": "user", "content": text}]}
    body.update(extra)
    return client.send("RUN_STARTED", "USER", {"run_id": run_id, "thread_id": "t1",
                                                "metadata": {"agui": body}})


def run_events(client: WSClient, within: float = 10) -> list[dict[str, Any]]:
    """The envelopes of one run's AG-UI events, up to its terminal event."""
    out: list[dict[str, Any]] = []
    while True:
        msg = client.recv_until(lambda m: m["type"] == "AGUI_EVENT", within)
        validate(msg["payload"])
        out.append(msg)
        if msg["payload"]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
            return out


def shape(envelopes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["payload"]["type"], e["payload"].get("delta"),
             (e["payload"].get("outcome") or {}).get("type")) for e in envelopes]


def test_a_run_over_the_socket_is_ag_ui_events_in_envelopes(agui_server):
    with socket_client(agui_server) as client:
        reply = agui_hello(client)
        assert reply["payload"]["capabilities"]["extensions"] == ["agui"]
        start(client, "r1", "hi")
        events = run_events(client)
        assert shape(events) == [("RUN_STARTED", None, None), ("TEXT_MESSAGE_START", None, None),
                                 ("TEXT_MESSAGE_CONTENT", "echo: hi", None),
                                 ("TEXT_MESSAGE_END", None, None), ("RUN_FINISHED", None, None)]
        assert events[0]["payload"] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}
        seqs = [int(e["seq"]) for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert all(e["session"] == client.session_id and e["channel"] == "AGENT"
                   for e in events)
        # the native protocol goes on around the runs: a PING, a text outside a run
        client.send("PING", "SYSTEM", {"nonce": "n1"})
        assert client.recv_type("PONG")["payload"]["nonce"] == "n1"
        client.send("MESSAGE_START", "USER", {"message_id": "u1", "content_type": "text/plain"})
        client.send("MESSAGE_PART", "USER", {"message_id": "u1", "content": "native"})
        client.send("MESSAGE_END", "USER", {"message_id": "u1"})
        part = client.recv_type("MESSAGE_PART")
        assert part["payload"]["content"] == "native"  # the native echo, natively


def test_tools_state_and_errors(agui_server):
    with socket_client(agui_server) as client:
        agui_hello(client)
        start(client, "r-tool", "tool")
        kinds = [e["payload"]["type"] for e in run_events(client)]
        for kind in ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "CUSTOM",
                     "TOOL_CALL_RESULT"):
            assert kind in kinds
        start(client, "r-state", "state")
        kinds = [e["payload"]["type"] for e in run_events(client)]
        assert kinds == ["RUN_STARTED", "STATE_SNAPSHOT", "STATE_DELTA", "RUN_FINISHED"]
        start(client, "r-fail", "fail")
        events = run_events(client)
        assert events[-1]["payload"]["type"] == "RUN_ERROR"
        # a RunAgentInput the adapter refuses: the run started, and ends with RUN_ERROR
        start(client, "r-bad", "x", messages="not a list")
        events = run_events(client)
        assert [e["payload"]["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
        assert events[-1]["payload"]["code"] == "INVALID_MESSAGE"


def test_run_cancel_closes_what_is_open_then_finishes_cancelled(agui_server):
    with socket_client(agui_server) as client:
        agui_hello(client)
        start(client, "r-stop", "long")
        client.recv_until(lambda m: m["type"] == "AGUI_EVENT"
                          and m["payload"]["type"] == "TEXT_MESSAGE_CONTENT")
        client.send("RUN_CANCEL", "USER", {"run_id": "r-stop"})
        rest = run_events(client)
        assert rest[-1]["payload"]["outcome"] == {"type": "cancelled"}
        end = [e for e in rest if e["payload"]["type"] == "TEXT_MESSAGE_END"]
        assert len(end) == 1 and "seq" not in end[0]  # made up: no seq of its own


@pytest.mark.parametrize("cut_after", [2, 7])
def test_a_resume_mid_run_gives_exactly_the_uncut_runs_events(agui_server, cut_after):
    with socket_client(agui_server, "uncut") as client:
        agui_hello(client)
        start(client, "r-uncut", "long")
        uncut = run_events(client)
    client = socket_client(agui_server, "cut")
    agui_hello(client)
    start(client, "r-cut", "long")
    got = [client.recv_until(lambda m: m["type"] == "AGUI_EVENT") for _ in range(cut_after)]
    session, last_seq = client.session_id, max(int(e["seq"]) for e in got)
    client.drop()
    with socket_client(agui_server, "cut", session=session, last_seq=last_seq) as resumed:
        got += run_events(resumed)
    for event in got:
        validate(event["payload"])
    assert shape(got) == shape(uncut)
    assert [e["payload"]["type"] for e in got].count("RUN_STARTED") == 1


def test_a_session_that_did_not_ask_stays_native(agui_server):
    with socket_client(agui_server) as client:
        client.hello()
        start(client, "r-native", "hi")
        done = client.recv_type("RUN_FINISHED", run_id="r-native")
        kinds = [m["type"] for m in client.received]
        assert "MESSAGE_PART" in kinds and "AGUI_EVENT" not in kinds
        assert done["payload"]["status"] == "finished"
