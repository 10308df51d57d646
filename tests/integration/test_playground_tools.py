"""The playground's operator tools in Chromium: the token leaves the address bar once
read; the wire log has timestamps, a filter that hides ACK/PING/PONG/FLOW_UPDATE and
pretty JSON on a click; a raw message sender; a call history; partial results shown
on the call; a run started and cancelled (its call cancelled with it); a drop-connection
button whose session resumes; the server URL field."""

from __future__ import annotations

import json
import re
from typing import Any

import gevent
import gevent.event

from protoflask import Tool

from .test_dashboard_browser import browser, open_playground, wait_js, wire  # noqa: F401


def gated_tool(server: Any) -> gevent.event.Event:
    """``gated``: reports a partial result, then waits for the returned event."""
    gate = gevent.event.Event()

    def gated(params: dict, session_id: str, call_id: str, srv: Any) -> dict:
        srv.send_tool_update(session_id, call_id, "RUNNING", 50, partial={"draft": "Dear"})
        gate.wait(10)
        return {"text": "Dear reader"}

    server.register_tool(Tool("gated", "Reports a partial result, then waits.",
                              {"type": "object"}, execute=gated))
    return gate


def test_address_bar_log_filter_pretty_json_and_raw_sender(browser, make_server):  # noqa: F811
    server = make_server()
    gated_tool(server)  # a third tool: what open_playground waits for
    token = server.issue_token("tools-user")
    page = open_playground(browser, server, token, "websocket")
    assert "token" not in page.url, page.url  # read once, then out of the address bar
    assert page.evaluate("sessionStorage.getItem('protoflask-token')") == token

    times = page.evaluate("[...document.querySelectorAll('#wire-log li .time')]"
                          ".map(t => t.textContent)")
    assert times and all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", t) for t in times), times

    # a raw message: PING on SYSTEM with a nonce of our own, answered by a PONG
    page.select_option("#raw-channel", "SYSTEM")
    page.fill("#raw-type", "PING")
    page.fill("#raw-payload", '{"nonce": "by hand"}')
    page.click("#raw-send")
    wait_js(page, "window.playground.wire.some(f => f.dir === 'in' && f.type === 'PONG' "
                  "&& JSON.parse(f.raw).payload.nonce === 'by hand')", what="the PONG")
    assert page.inner_text("#raw-status").startswith("sent ")
    page.fill("#raw-payload", "{not json")
    page.click("#raw-send")
    assert "not valid JSON" in page.inner_text("#raw-status")

    # a click shows a line's JSON, pretty-printed
    pong = page.locator("#wire-log li.in", has_text="by hand").first
    pong.click()
    pretty = pong.locator("pre").inner_text()
    assert "\n" in pretty and json.loads(pretty)["payload"] == {"nonce": "by hand"}

    # the filter hides the control messages and nothing else
    def shown(kind: str) -> list[bool]:
        return page.evaluate(f"[...document.querySelectorAll('#wire-log li.{kind}')]"
                             ".map(li => li.offsetParent !== null)")
    assert all(shown("control")) and shown("control")
    page.check("#log-quiet")
    assert not any(shown("control"))
    assert page.evaluate("[...document.querySelectorAll('#wire-log li:not(.control)')]"
                         ".every(li => li.offsetParent !== null)")
    page.uncheck("#log-quiet")
    assert all(shown("control"))
    assert not page.problems, page.problems


def test_partial_results_history_runs_and_drop(browser, make_server):  # noqa: F811
    server = make_server()
    gate = gated_tool(server)
    page = open_playground(browser, server, server.issue_token("runs-user"), "sse")
    session = page.evaluate("window.playground.client.session")

    # partial: shown on the call while it runs, then the result
    page.select_option("#tool-select", "gated")
    page.click("#tool-call")
    wait_js(page, "document.getElementById('tool-result').textContent.startsWith('partial:')",
            what="the partial result")
    assert json.loads(page.inner_text("#tool-result").split(":", 1)[1]) == {"draft": "Dear"}
    server._call(gate.set)  # the tool returns
    wait_js(page, "document.getElementById('tool-status').textContent === 'OK'", what="OK")
    assert json.loads(page.inner_text("#tool-result")) == {"text": "Dear reader"}
    history = page.inner_text("#call-history")
    assert 'gated {}: OK {"text":"Dear reader"}' in history, history

    # a run: started here, a call in it, cancelled with it
    gate.clear()
    page.click("#run-start")
    wait_js(page, "/^run .* active$/.test(document.getElementById('run-status').textContent)",
            what="the run")
    run_id = page.inner_text("#run-status").split()[1]
    page.click("#tool-call")
    wait_js(page, "document.getElementById('tool-result').textContent.startsWith('partial:')",
            what="the call in the run")
    page.click("#run-cancel")
    wait_js(page, f"document.getElementById('run-status').textContent === 'run {run_id} "
                  "cancelled'", what="the run cancelled")
    wait_js(page, "document.getElementById('tool-status').textContent === 'CANCELLED'",
            what="its call cancelled")
    assert page.inner_text("#call-history").splitlines()[0] == "gated {}: CANCELLED"
    assert page.is_disabled("#run-cancel")
    server._call(gate.set)

    # drop the connection: the client resumes the same session
    hellos = sum(1 for f in wire(page) if f["dir"] == "out" and f["type"] == "HELLO")
    page.click("#drop")
    wait_js(page, f"window.playground.wire.filter(f => f.dir === 'out' && f.type === 'HELLO')"
                  f".length === {hellos + 1}", what="a second HELLO")
    wait_js(page, "document.getElementById('conn-status').dataset.state === 'ready'",
            what="ready again")
    assert page.evaluate("window.playground.client.session") == session
    page.fill("#chat-input", "still here")
    page.click("#chat-send")
    wait_js(page, "window.playground.chat.some(c => c.who === 'agent' "
                  "&& c.text === 'still here')", what="the echo after the resume")
    assert not page.problems, page.problems


def test_the_server_url_field(browser, make_server):  # noqa: F811
    server = make_server()
    gated_tool(server)
    page = open_playground(browser, server, server.issue_token("url-user"), "websocket")
    page.fill("#server-url", f"http://127.0.0.1:{server.port}/nowhere/")
    page.click("#connect")
    wait_js(page, "document.getElementById('conn-status').dataset.state === 'closed'",
            what="the refusal from a URL with no protoflask")
    page.fill("#server-url", server.base_url)
    page.click("#connect")
    wait_js(page, "document.getElementById('conn-status').dataset.state === 'ready'",
            what="connected through the URL field")
