"""The published @ag-ui/client HttpAgent in headless Chromium (bundled from tests/agui/node
by its pinned esbuild, no protoflask code in the page), from a page of another origin:
streamed text, a server tool call with progress and result, a frontend tool call, a
stopped run, a failing run, and 100 runs on one thread."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from ..interop.conftest import CHROMIUM_ARGS, QUIET, PageServer, need_chromium
from ..support import timeout
from .conftest import agent_handler, client_bundle, validate, weather_tool

#: What the page runs: n runs of one HttpAgent (a text of null: no new user message, e.g.
#: after a frontend tool's answer), and what each saw: its events and its end.
SCRIPT = """
window.runs = async (base, token, thread, texts, opts) => {
  const agent = new AGUI.HttpAgent({url: base + "/proto/agui", threadId: thread,
                                    headers: {Authorization: "Bearer " + token}});
  const out = [];
  for (const text of texts) {
    const seen = {events: [], end: null};
    if (text !== null) agent.addMessage({id: "u" + Math.random(), role: "user", content: text});
    let stopped = false;
    const runId = "run-" + Math.random().toString(36).slice(2);
    try {
      const {result} = await agent.runAgent({runId, tools: opts.tools || []}, {
        onEvent: async ({event}) => {
          seen.events.push(event);
          if (opts.stop && !stopped && event.type === "TEXT_MESSAGE_CONTENT") {
            stopped = true;
            const r = await fetch(base + "/proto/agui/stop", {method: "POST",
              headers: {Authorization: "Bearer " + token, "Content-Type": "application/json"},
              body: JSON.stringify({threadId: thread, runId})});
            seen.stop = r.status;
          }
        }});
      seen.end = {ok: true, result: result === undefined ? null : result};
    } catch (err) {
      seen.end = {ok: false, message: String(err.message || err)};
    }
    if (opts.answer) {
      const call = seen.events.find(e => e.type === "TOOL_CALL_START");
      if (call) agent.addMessage({id: "t" + call.toolCallId, role: "tool",
                                  toolCallId: call.toolCallId, content: opts.answer});
    }
    out.push(seen);
  }
  return out;
};
"""


@pytest.fixture(scope="module")
def bundle() -> str:
    code = client_bundle("iife")
    assert "</script" not in code
    return code


@pytest.fixture
def page(bundle: str, make_server: Any) -> Iterator[tuple[Any, Any]]:
    chromium = need_chromium()
    from playwright.sync_api import sync_playwright

    html = f"<!doctype html><script>{bundle}</script><script>{SCRIPT}</script>"
    pages = PageServer({"/": html})
    server = make_server(allowedOrigins=[pages.origin], **QUIET)
    weather_tool(server)
    server.agui_handler(agent_handler(server))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                tab = browser.new_page()
                tab.goto(pages.origin + "/")
                yield server, tab
            finally:
                browser.close()
    finally:
        pages.close()


def runs(page: tuple[Any, Any], thread: str, texts: list[str | None],
         **opts: Any) -> list[dict[str, Any]]:
    server, tab = page
    tab.set_default_timeout(timeout(60) * 1000)
    got = tab.evaluate("([b, t, th, x, o]) => runs(b, t, th, x, o)",
                       [server.base_url, server.issue_token("browser"), thread, texts, opts])
    for run in got:
        for event in run["events"]:
            validate(event)
    return got


def types(run: dict[str, Any]) -> list[str]:
    return [e["type"] for e in run["events"]]


def test_text_tool_and_error_in_chromium(page):
    text, tool, fail = runs(page, "b-1", ["hello", "tool", "fail"])
    assert types(text) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                           "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert text["events"][2]["delta"] == "echo: hello" and text["end"]["ok"]
    assert types(tool)[4:9] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
                                "CUSTOM", "TOOL_CALL_RESULT"]
    assert tool["events"][8]["content"] == '{"temp":21}'
    assert tool["end"] == {"ok": True, "result": {"temp": 21}}
    assert types(fail)[-1] == "RUN_ERROR"
    assert fail["events"][-1]["message"] == "the model is unavailable"


def test_frontend_tool_and_stop_in_chromium(page):
    first, second = runs(page, "b-2", ["frontend", None], answer="yes",
                         tools=[{"name": "confirm", "description": "Ask the user"}])
    assert types(first) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS",
                            "TOOL_CALL_END", "RUN_FINISHED"]
    assert second["events"][2]["delta"] == "confirmed: yes"
    (stopped,) = runs(page, "b-3", ["slow"], stop=True)
    assert stopped["stop"] == 200
    assert stopped["events"][-1]["outcome"] == {"type": "cancelled"}
    assert types(stopped).count("TEXT_MESSAGE_START") == types(stopped).count(
        "TEXT_MESSAGE_END")


def test_hundred_runs_on_one_thread_in_chromium(page):
    got = runs(page, "b-soak", [f"m{i}" for i in range(100)])
    assert len(got) == 100
    for i, run in enumerate(got):
        assert run["end"]["ok"], (i, run["end"])
        assert types(run) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                              "TEXT_MESSAGE_END", "RUN_FINISHED"]
        assert run["events"][2]["delta"] == f"echo: m{i}"
