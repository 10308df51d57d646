"""The published @ag-ui/client HttpAgent (Node) runs against /proto/agui, its event-order
verifier included: streamed text, a server tool call with progress and result, a
frontend tool call answered in the next run, a stopped run, a failing run, 100 runs on
one thread, and a stream cut mid-run that HttpAgent re-attaches with Last-Event-ID."""

from __future__ import annotations

from typing import Any

from .conftest import run_node, validate


def events(lines: list[dict[str, Any]], run: int = 0) -> list[dict[str, Any]]:
    out = [line["event"] for line in lines if line["kind"] == "event" and line["run"] == run]
    for event in out:
        validate(event)
    return out


def types(evs: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in evs]


def done(lines: list[dict[str, Any]], run: int = 0) -> dict[str, Any]:
    ends = [line for line in lines if line["kind"] in ("done", "error") and line["run"] == run]
    assert len(ends) == 1, lines
    return ends[0]


def test_streamed_text_echo(agui_server):
    lines = run_node("run", agui_server.base_url, agui_server.issue_token("u"), "t-text",
                     "hello agent")
    evs = events(lines)
    assert types(evs) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                          "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert evs[2]["delta"] == "echo: hello agent"
    end = done(lines)
    assert end["kind"] == "done"
    assert [m["content"] for m in end["messages"]] == ["echo: hello agent"]


def test_server_tool_call_progress_and_result(agui_server):
    lines = run_node("run", agui_server.base_url, agui_server.issue_token("u"), "t-tool", "tool")
    evs = events(lines)
    assert types(evs) == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "CUSTOM",
        "TOOL_CALL_RESULT", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED"]
    start = evs[4]
    assert start["toolCallName"] == "weather"
    assert evs[5]["delta"] == '{"city":"Paris"}'
    progress = [e["value"] for e in evs if e["type"] == "CUSTOM"]
    assert all(e["name"] == "protoflask.tool_progress" for e in evs if e["type"] == "CUSTOM")
    assert progress[-1] == {"toolCallId": start["toolCallId"], "status": "RUNNING",
                            "progress": 50, "partial": {"city": "Paris"}}
    assert evs[8]["toolCallId"] == start["toolCallId"] and evs[8]["content"] == '{"temp":21}'
    assert evs[-1]["result"] == {"temp": 21}
    end = done(lines)
    assert end["kind"] == "done" and end["result"] == {"temp": 21}


def test_frontend_tool_call_then_its_result(agui_server):
    lines = run_node("frontend", agui_server.base_url, agui_server.issue_token("u"), "t-fe")
    first, second = events(lines, 0), events(lines, 1)
    assert types(first) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS",
                            "TOOL_CALL_END", "RUN_FINISHED"]
    assert first[1]["toolCallName"] == "confirm"
    assert first[2]["delta"] == '{"question":"Proceed?"}'
    assert done(lines, 0)["kind"] == "done"
    assert types(second) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                             "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert second[2]["delta"] == "confirmed: yes"


def test_stopped_run_ends_cancelled(agui_server):
    lines = run_node("stop", agui_server.base_url, agui_server.issue_token("u"), "t-stop")
    evs = events(lines)
    stop = [line for line in lines if line["kind"] == "stop"]
    assert stop and stop[0]["status"] == 200 and stop[0]["body"] == {"stopped": True}
    assert evs[0]["type"] == "RUN_STARTED"
    assert evs[-1] == {"type": "RUN_FINISHED", "threadId": "t-stop", "runId": "run-to-stop",
                       "outcome": {"type": "cancelled"}}
    assert types(evs).count("TEXT_MESSAGE_START") == types(evs).count("TEXT_MESSAGE_END")
    assert done(lines)["kind"] == "done"


def test_failing_run_is_run_error(agui_server):
    lines = run_node("run", agui_server.base_url, agui_server.issue_token("u"), "t-fail", "fail")
    evs = events(lines)
    assert types(evs) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                          "TEXT_MESSAGE_END", "RUN_ERROR"]
    assert evs[-1] == {"type": "RUN_ERROR", "message": "the model is unavailable",
                       "code": "INTERNAL_ERROR"}


def test_hundred_runs_on_one_thread(agui_server):
    lines = run_node("soak", agui_server.base_url, agui_server.issue_token("u"), "t-soak",
                     "100", within=120)
    for i in range(100):
        evs = events(lines, i)
        assert types(evs) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                              "TEXT_MESSAGE_END", "RUN_FINISHED"], i
        assert evs[2]["delta"] == f"echo: message {i}"
        assert done(lines, i)["kind"] == "done"
    # one session for the thread, and it holds no run any more
    stats = agui_server.get_stats()
    assert stats["activeConnections"] == 0


def normalized(evs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Events with their generated ids replaced by their order of appearance."""
    names: dict[str, str] = {}
    out = []
    for e in evs:
        e = dict(e)
        for key in ("messageId", "toolCallId", "runId", "threadId"):
            if key in e:
                e[key] = names.setdefault(f"{key}:{e[key]}", f"{key}{len(names)}")
        if e["type"] == "CUSTOM":
            e["value"] = {**e["value"], "toolCallId": "x"}
        out.append((e["type"], sorted(e.items())))
    return out


def test_cut_stream_reattached_by_httpagent_has_the_uncut_runs_events(agui_server):
    token = agui_server.issue_token("u")
    uncut = events(run_node("run", agui_server.base_url, token, "t-uncut", "slow"))
    lines = run_node("cut", agui_server.base_url, token, "t-cut", "5")
    before = events(lines, 0)
    after = events(lines, 1)
    assert len(before) == 5 and done(lines, 1)["kind"] == "done", lines[-3:]
    # the join prelude re-opens the run and the text open at the cut (no id: on them)
    open_texts = types(before).count("TEXT_MESSAGE_START") - types(before).count(
        "TEXT_MESSAGE_END")
    prelude = 1 + open_texts
    assert types(after)[:prelude] == ["RUN_STARTED"] + ["TEXT_MESSAGE_START"] * open_texts
    assert normalized(before + after[prelude:]) == normalized(uncut)


def test_a_user_over_the_memory_budget_is_refused_a_new_thread(agui_server):
    """A new AG-UI thread meets the memory budget as a new WebSocket session does
    (docs/AGUI.md): while a user's sessions hold more than maxUserBytes, HttpAgent's run
    on a new thread fails with the 503 before any event; another user's runs."""
    from ..support import hold_over_budget

    alice, client = hold_over_budget(agui_server, "alice")
    try:
        lines = run_node("run", agui_server.base_url, alice, "t-budget", "hello")
        assert events(lines) == []
        end = done(lines)
        assert end["kind"] == "error" and "503" in end["message"], end
        lines = run_node("run", agui_server.base_url, agui_server.issue_token("bob"),
                         "t-budget-bob", "hello")
        assert done(lines)["kind"] == "done"
    finally:
        client.close()
