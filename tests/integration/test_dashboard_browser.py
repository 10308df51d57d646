"""The page at / in headless Chromium (Playwright driving /usr/bin/chromium): the
playground connects over WebSocket and over SSE, chats with a server that streams its
replies, calls a tool through the form built from its inputSchema and shows its progress
and result, and logs every frame; it keeps a session healthy (heartbeats, credit both
ways); the dashboard's numbers match /stats. Screenshots go to test-artifacts/.

The page's Content-Security-Policy stays enforced: the tests poll with page.evaluate
(which CSP allows) rather than wait_for_function (which needs 'unsafe-eval')."""

from __future__ import annotations

import json
from typing import Any, Iterator

import gevent
import pytest

from protoflask import Tool

from ..support import ROOT, wait_for
from .test_browser import CHROMIUM, CHROMIUM_ARGS, require_chromium

ARTIFACTS = ROOT / "test-artifacts"

PROGRESS_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string"}, "steps": {"type": "integer"},
                   "loud": {"type": "boolean"}, "mode": {"enum": ["fast", "slow"]}},
    "required": ["label", "steps", "mode"],
    "additionalProperties": False,
}


@pytest.fixture
def browser() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def wait_js(page: Any, expression: str, within: float = 10, what: str | None = None) -> Any:
    return wait_for(lambda: page.evaluate(expression), within, what or expression)


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def ticket_refusal(message: Any) -> bool:
    """The 404 a server without POST /proto/ticket answers (the client then falls back to
    ``token=``): Chromium logs it as a console error, but it is expected."""
    return "404" in message.text and message.location.get("url", "").endswith("/proto/ticket")


def open_playground(browser: Any, server: Any, token: str, transport: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error"
            and not ticket_refusal(m) else None)
    page.problems = problems
    urls: list[str] = []  # every URL the page asked for (the token must be in none)
    page.on("request", lambda r: urls.append(r.url))
    page.on("websocket", lambda ws: urls.append(ws.url))
    page.urls = urls
    page.goto(f"{server.base_url}/#token={token}")
    page.click("#tab-playground")
    page.select_option("#transport", transport)
    page.click("#connect")
    wait_js(page, "document.getElementById('conn-status').dataset.state === 'ready'",
            what="the handshake")
    wait_js(page, "document.querySelectorAll('#tool-select option').length >= 3",
            what="TOOL_LIST to fill the tool menu")
    return page


def wire(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("window.playground.wire")


def replying_server(make_server: Any, **config: Any) -> Any:
    """A server whose agent answers each text in three streamed parts, with a tool that
    reports progress."""
    server = make_server(echoMessages=False, **config)

    def reply(session_id: str, message: dict[str, Any]) -> None:
        if message["type"] != "MESSAGE_END":
            return
        mid = f"reply-{message['payload']['message_id']}"
        send = server.send_message
        send(session_id, {"type": "MESSAGE_START", "channel": "AGENT",
                          "payload": {"message_id": mid, "content_type": "text/plain"}})
        for part in ("you ", "said: ", message["payload"]["text"]):
            send(session_id, {"type": "MESSAGE_PART", "channel": "AGENT",
                              "payload": {"message_id": mid, "content": part}})
        send(session_id, {"type": "MESSAGE_END", "channel": "AGENT",
                          "payload": {"message_id": mid}})

    server.on("textMessage", reply)

    def progress(params: dict, session_id: str, call_id: str, srv: Any) -> dict:
        for pct in (25, 50, 75):
            srv.send_tool_update(session_id, call_id, "RUNNING", pct)
            gevent.sleep(0.02)
        return {"label": params["label"], "steps": params["steps"],
                "loud": params.get("loud", False), "mode": params["mode"]}

    server.register_tool(Tool("progress", "Reports progress, then echoes its params.",
                              PROGRESS_SCHEMA, execute=progress))
    return server


@pytest.mark.parametrize("transport", ["websocket", "sse"])
def test_playground_chat_tool_call_and_dashboard(browser, make_server, transport):
    server = replying_server(make_server)
    token = server.issue_token("browser-user")
    page = open_playground(browser, server, token, transport)
    session_id = page.evaluate("window.playground.client.session")
    # the token is in no URL (proxies log them): a WebSocket connects with a connect
    # ticket, SSE sends the token in its Authorization header
    sent = [u.split("#")[0] for u in page.urls]
    if transport == "websocket":
        assert any("ticket=" in u for u in sent), sent
    assert not [u for u in sent if token in u or "token=" in u], sent

    # chat: the reply arrives in three parts and is shown assembled
    page.fill("#chat-input", "hello from chromium")
    page.click("#chat-send")
    wait_js(page, "window.playground.chat.some(c => c.who === 'agent')", what="the reply")
    assert page.evaluate("window.playground.chat") == [
        {"who": "me", "text": "hello from chromium"},
        {"who": "agent", "text": "you said: hello from chromium"}]
    assert page.inner_text("#chat .agent .text") == "you said: hello from chromium"
    parts = [f for f in wire(page) if f["dir"] == "in" and f["type"] == "MESSAGE_PART"]
    assert len(parts) == 3

    # a tool call through the generated form
    page.select_option("#tool-select", "progress")
    assert page.evaluate("[...document.querySelectorAll('#tool-form [data-kind]')]"
                         ".map(e => [e.name, e.dataset.kind, e.dataset.required])") == [
        ["label", "string", "1"], ["steps", "integer", "1"], ["loud", "boolean", ""],
        ["mode", "enum", "1"]]
    page.fill("#param-label", "chart")
    page.fill("#param-steps", "3")
    page.check("#param-loud")
    page.select_option("#param-mode", json.dumps("slow"))
    page.click("#tool-call")
    wait_js(page, "document.getElementById('tool-status').textContent === 'OK'",
            what="TOOL_DONE OK")
    assert json.loads(page.inner_text("#tool-result")) == {
        "label": "chart", "steps": 3, "loud": True, "mode": "slow"}
    calls = page.evaluate("window.playground.calls")
    (call,) = calls.values()
    assert call["params"] == {"label": "chart", "steps": 3, "loud": True, "mode": "slow"}
    assert [u["progress"] for u in call["updates"]] == [25, 50, 75]
    assert page.evaluate("document.getElementById('tool-progress').value") == 100

    # the wire log holds every frame both ways, in order, and nothing went wrong (read in
    # one evaluation: the client keeps writing ACKs and idle PINGs meanwhile)
    shown, frames = page.evaluate(
        "[document.querySelectorAll('#wire-log li.in, #wire-log li.out').length,"
        " window.playground.wire]")
    sequence = [(f["dir"], f["type"]) for f in frames]
    for expected in [("out", "HELLO"), ("in", "HELLO"), ("out", "TOOL_LIST"), ("in", "TOOL_LIST"),
                     ("out", "MESSAGE_END"), ("in", "MESSAGE_END"), ("out", "TOOL_CALL"),
                     ("in", "TOOL_UPDATE"), ("in", "TOOL_DONE")]:
        assert expected in sequence
    assert sequence.index(("out", "TOOL_CALL")) < sequence.index(("in", "TOOL_DONE"))
    assert not [f for f in frames if f["type"] == "ERROR"]
    assert shown == len(frames)
    in_seqs = [int(f["seq"]) for f in frames if f["dir"] == "in"]
    assert in_seqs == list(range(1, len(in_seqs) + 1))  # nothing lost or repeated
    screenshot(page, f"playground-{transport}")

    # the dashboard: its numbers are /stats', its tables show this session and the tool
    page.click("#tab-dashboard")

    def dashboard_matches_stats() -> bool:
        stats = server.get_stats()
        shown = {key: page.evaluate(
            f"document.getElementById('stat-{key}').dataset.value") for key in
            ("totalMessages", "totalConnections", "activeConnections")}
        return shown == {key: str(stats[key]) for key in shown}

    wait_for(dashboard_matches_stats, within=10, what="the dashboard to show /stats' numbers")
    assert page.inner_text("#stat-activeConnections") == "1"
    assert page.inner_text("#stat-transports") == f"{transport} 1"
    wait_js(page, f"!!document.querySelector('#sessions tr[data-session=\"{session_id}\"]')",
            what="this session in the sessions table")
    row = page.inner_text(f"#sessions tr[data-session=\"{session_id}\"]")
    assert "browser-user" in row and transport in row
    assert page.evaluate("!!document.querySelector('#tools tr[data-tool=\"progress\"]')")
    screenshot(page, f"dashboard-{transport}")
    assert page.problems == []


@pytest.mark.parametrize("transport", ["websocket", "sse"])
def test_playground_answers_heartbeats_and_keeps_to_its_credit(browser, make_server, transport):
    # upstream: two messages of credit, topped up only at zero, so a three-message
    # text makes the page wait for FLOW_UPDATE; downstream: a tool sends more updates
    # than the 200 the page announces, so the page must grant more itself
    server = replying_server(make_server, heartbeatInterval=200, heartbeatTimeout=2000,
                             flowControl={"initialCreditMessages": 2, "creditThreshold": 0})

    def chatty(params: dict, session_id: str, call_id: str, srv: Any) -> dict:
        for i in range(250):
            srv.send_tool_update(session_id, call_id, "RUNNING", i * 100 / 250)
        return {"updates": 250}

    server.register_tool(Tool("chatty", "Sends 250 progress updates.", {"type": "object"},
                              execute=chatty))
    page = open_playground(browser, server, server.issue_token("browser-user"), transport)
    session_id = page.evaluate("window.playground.client.session")

    page.fill("#chat-input", "wait for credit")
    page.click("#chat-send")
    wait_js(page, "window.playground.chat.some(c => c.who === 'agent')", what="the reply")
    sequence = [(f["dir"], f["type"]) for f in wire(page)]
    assert sequence.index(("in", "FLOW_UPDATE")) < sequence.index(("out", "MESSAGE_END"))

    page.select_option("#tool-select", "chatty")
    assert page.input_value("#param-params") == "{}"
    page.click("#tool-call")
    wait_js(page, "document.getElementById('tool-status').textContent === 'OK'",
            within=15, what="TOOL_DONE after 250 updates")
    grants = [json.loads(f["raw"])["payload"] for f in wire(page)
              if f["dir"] == "out" and f["type"] == "FLOW_UPDATE"]
    assert any(g["channel"] == "AGENT" and g["add_messages"] > 0 for g in grants)

    pings = wait_js(page, "window.playground.wire.filter(f => f.dir === 'in' && f.type === 'PING')"
                          ".length >= 3 && window.playground.wire", within=10,
                    what="three heartbeat PINGs")
    nonces_in = [json.loads(f["raw"])["payload"]["nonce"] for f in pings
                 if f["dir"] == "in" and f["type"] == "PING"]
    nonces_out = [json.loads(f["raw"])["payload"]["nonce"] for f in pings
                  if f["dir"] == "out" and f["type"] == "PONG"]
    assert set(nonces_in[:3]) <= set(nonces_out)
    assert not [f for f in wire(page) if f["type"] == "ERROR"]
    snapshot = server.get_session(session_id)
    assert snapshot["connected"] is True
    assert page.evaluate("document.getElementById('conn-status').dataset.state") == "ready"
    screenshot(page, f"playground-healthy-{transport}")
    assert page.problems == []


def test_dashboard_without_a_token_shows_numbers_but_no_sessions(browser, make_server):
    server = make_server()
    page = browser.new_page()
    page.goto(f"{server.base_url}/")
    wait_js(page, "document.getElementById('stat-uptime').dataset.value !== undefined",
            what="the first poll")
    assert page.inner_text("#stat-totalConnections") == str(
        server.get_stats()["totalConnections"])
    assert "Enter a token" in page.inner_text("#sessions-note")
    assert page.evaluate("document.querySelectorAll('#sessions tbody tr').length") == 0
    assert page.evaluate("document.querySelectorAll('#tools tbody tr').length") == 0
    page.click("#tab-playground")
    page.click("#connect")
    assert page.inner_text("#conn-status") == "closed: enter a token first"


@pytest.mark.parametrize("transport", ["websocket", "sse", "stream"])
def test_browser_build_of_the_client_resumes_without_loss(browser, make_server, transport):
    """The TypeScript client's browser build (protoclient.mjs) in Chromium, through the
    playground: connect, chat, a tool call, then the connection drops and the session
    resumes; nothing is lost or repeated either way."""
    server = replying_server(make_server)
    page = open_playground(browser, server, server.issue_token("browser-user"), transport)
    session_id = page.evaluate("window.playground.client.session")
    page.fill("#chat-input", "before the drop")
    page.click("#chat-send")
    wait_js(page, "window.playground.chat.length === 2", what="the first reply")

    # drop the connection, send while it is down, and read the replies after the resume
    page.evaluate("window.playground.client.dropConnection()")
    for text in ("while down 1", "while down 2"):
        page.evaluate(f"window.playground.client.sendText({json.dumps(text)})")
    wait_js(page, "window.playground.client.reconnects === 1", what="the resume")
    wait_js(page, "window.playground.chat.filter(c => c.who === 'agent').length === 3",
            what="the replies after the resume")
    assert [c["text"] for c in page.evaluate("window.playground.chat") if c["who"] == "agent"] == [
        "you said: before the drop", "you said: while down 1", "you said: while down 2"]
    assert page.evaluate("window.playground.client.session") == session_id
    page.select_option("#tool-select", "add")
    page.fill("#param-a", "2")
    page.fill("#param-b", "40")
    page.click("#tool-call")
    wait_js(page, "document.getElementById('tool-status').textContent === 'OK'",
            what="TOOL_DONE OK")
    assert json.loads(page.inner_text("#tool-result")) == {"result": 42}
    in_seqs = [int(f["seq"]) for f in wire(page) if f["dir"] == "in"]
    assert in_seqs == list(range(1, len(in_seqs) + 1))  # nothing lost or repeated
    assert not [f for f in wire(page) if f["type"] == "ERROR"]
    assert page.problems == []


def test_playground_form_names_a_missing_required_field(browser, make_server):
    server = replying_server(make_server)
    page = open_playground(browser, server, server.issue_token("browser-user"), "websocket")
    page.select_option("#tool-select", "add")
    page.fill("#param-a", "2")  # b left empty
    page.click("#tool-call")
    assert page.inner_text("#tool-result") == "b is required"
    assert page.evaluate("document.getElementById('param-b').getAttribute('aria-invalid')") == \
        "true"
    assert not [f for f in wire(page) if f["type"] == "TOOL_CALL"]  # nothing was sent
    assert page.evaluate("Object.keys(window.playground.calls).length") == 0
