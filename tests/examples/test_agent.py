"""examples/agent: a server-side agent answering each text inside a run, with a tool that
reports progress and a token stream that RUN_CANCEL stops. Served for real, spoken to
with WSClient."""

from __future__ import annotations

import time

import jwt
import pytest

from ..support import SECRET, GunicornServer, WSClient, timeout, wait_for
from .conftest import EXAMPLES, import_example

FAST = {"AGENT_TOKEN_DELAY": 0.002, "AGENT_SEARCH_DELAY": 0.005}


def say(client, text: str, message_id: str = "q1") -> None:
    client.send("MESSAGE_START", "USER", {"message_id": message_id,
                                          "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": message_id, "content": text})
    client.send("MESSAGE_END", "USER", {"message_id": message_id})


def after(received: list[dict], msg: dict) -> list[dict]:
    return received[received.index(msg) + 1:]


def test_agent_answers_in_a_run_with_tool_progress_and_streamed_tokens(serve_example,
                                                                       ws) -> None:
    server = serve_example("agent", **FAST)
    assert server.config.echo_messages is False  # the example turned the echo off
    client = ws(server)
    client.hello()
    say(client, "how do runs and tools work?")
    started = client.recv_type("RUN_STARTED")
    run_id = started["payload"]["run_id"]
    finished = client.recv_type("RUN_FINISHED", run_id=run_id, within=10)
    assert finished["payload"]["status"] == "finished"
    seen = after(client.received, started)
    assert seen.index(finished) == len(seen) - 1

    updates = [m for m in seen if m["type"] == "TOOL_UPDATE"]
    (done,) = [m for m in seen if m["type"] == "TOOL_DONE"]
    assert [u["payload"]["progress"] for u in updates] == [33, 67, 100]
    assert {u["payload"]["call_id"] for u in updates} == {done["payload"]["call_id"]}
    assert done["payload"]["status"] == "OK"
    titles = [h["title"] for h in done["payload"]["result"]["hits"]]
    assert titles == ["Runs group a reply", "Tools report progress"]

    texts = [m for m in seen if m["type"].startswith("MESSAGE_")]
    assert [m["type"] for m in texts[:1] + texts[-1:]] == ["MESSAGE_START", "MESSAGE_END"]
    assert seen.index(done) < seen.index(texts[0])  # the tool ran before the reply
    parts = [m["payload"]["content"] for m in texts[1:-1]]
    assert all(m["type"] == "MESSAGE_PART" for m in texts[1:-1]) and parts
    reply = "".join(parts)
    assert reply.startswith("You asked: how do runs and tools work? I found 2 notes.")
    assert reply.endswith("streams them the same way. ")
    # ~70 tokens 2 ms apart, coalesced into parts (one per 50 ms): far fewer parts
    assert len(parts) < len(reply.split()) / 2
    assert finished["payload"]["summary"] == {"parts": len(parts), "chars": len(reply)}
    # no echo: the only MESSAGE_START the client got is the agent's reply
    assert sum(m["type"] == "MESSAGE_START" for m in client.received) == 1


def test_each_text_gets_its_own_run(serve_example, ws) -> None:
    server = serve_example("agent", **FAST)
    client = ws(server)
    client.hello()
    say(client, "runs?", "q1")
    first = client.recv_type("RUN_FINISHED", within=10)["payload"]["run_id"]
    say(client, "tools?", "q2")
    second = client.recv_type("RUN_FINISHED", within=10)["payload"]["run_id"]
    assert first != second


def test_run_cancel_stops_the_stream_within_one_token(serve_example, ws) -> None:
    # tokens far enough apart that the RUN_CANCEL reaches the server within one of them
    server = serve_example("agent", AGENT_TOKEN_DELAY=timeout(0.15), AGENT_SEARCH_DELAY=0.005)
    cancelled = []
    server.on("runCancelled", lambda sid, run: cancelled.append((sid, run.run_id, run.status)))
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    say(client, "cancel me")
    run_id = client.recv_type("RUN_STARTED")["payload"]["run_id"]
    for _ in range(3):
        client.recv_type("MESSAGE_PART")
    client.send("RUN_CANCEL", "USER", {"run_id": run_id})
    sent_cancel_at = len(client.received)
    finished = client.recv_type("RUN_FINISHED", run_id=run_id)
    assert finished["payload"]["status"] == "cancelled"
    # stream_text closes the reply at the next token; a PING/PONG after that proves
    # nothing more was sent (the server writes in order: a late token would come first).
    client.recv_type("MESSAGE_END")
    client.send("PING", "SYSTEM", {"nonce": "after-cancel"})
    client.recv_type("PONG", nonce="after-cancel")

    in_flight = [m for m in client.received[sent_cancel_at:] if m["type"] == "MESSAGE_PART"]
    assert len(in_flight) <= 1, "more than one token after RUN_CANCEL"
    late = [m for m in after(client.received, finished) if m["type"] == "MESSAGE_PART"]
    assert late == [], "a token was streamed after the run was cancelled"
    tail = [m["type"] for m in after(client.received, finished)]
    assert tail == ["MESSAGE_END", "PONG"]  # the interrupted reply is closed, nothing else
    parts = [m for m in client.received if m["type"] == "MESSAGE_PART"]
    assert 3 <= len(parts) <= 4  # far from the ~70-token full reply
    assert cancelled == [(sid, run_id, "cancelled")]
    assert server.get_session(sid)["activeRuns"] == set()


def test_run_cancel_during_the_tool_call_cancels_the_call(serve_example, ws) -> None:
    server = serve_example("agent", AGENT_TOKEN_DELAY=0.002, AGENT_SEARCH_DELAY=0.2)
    agent = server.app.extensions["agent"]
    client = ws(server)
    client.hello()
    say(client, "slow search")
    run_id = client.recv_type("RUN_STARTED")["payload"]["run_id"]
    call_id = client.recv_type("TOOL_UPDATE")["payload"]["call_id"]  # the first note read
    client.send("RUN_CANCEL", "USER", {"run_id": run_id})
    done = client.recv_type("TOOL_DONE", call_id=call_id)  # after RUN_FINISHED, as for
    assert done["payload"]["status"] == "CANCELLED"       # a client's own call in a run
    (finished,) = [m for m in client.received if m["type"] == "RUN_FINISHED"]
    assert finished["payload"] == {"run_id": run_id, "status": "cancelled"}
    wait_for(lambda: len(agent.answers) == 0, what="the agent to stop answering")
    client.send("PING", "SYSTEM", {"nonce": "n"})
    client.recv_type("PONG", nonce="n")
    assert not [m for m in client.received if m["type"].startswith("MESSAGE_")]
    assert not [m for m in after(client.received, done) if m["type"] == "TOOL_UPDATE"]


def test_module_level_app_is_the_gunicorn_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    module = import_example("agent", monkeypatch)
    server = module.app.extensions["protoflask"]
    assert server.config.echo_messages is False
    assert "search" in {t.name for t in server.get_tools()}
    assert module.app.extensions["agent"].server is server


def test_under_gunicorn_gevent_worker() -> None:
    """The production path: ``gunicorn -k gevent --chdir examples/agent app:app``."""
    server = GunicornServer(app="app:app", chdir=EXAMPLES / "agent")
    try:
        token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET,
                           algorithm="HS256")
        client = WSClient(server.base_url, token)
        try:
            client.hello()
            say(client, "runs?")
            run_id = client.recv_type("RUN_STARTED")["payload"]["run_id"]
            client.recv_type("TOOL_DONE")
            client.recv_type("MESSAGE_PART")
            client.send("RUN_CANCEL", "USER", {"run_id": run_id})
            finished = client.recv_type("RUN_FINISHED", run_id=run_id)
            assert finished["payload"]["status"] == "cancelled"
            client.recv_type("MESSAGE_END")  # the interrupted reply is closed
        finally:
            client.close()
    finally:
        server.stop()

