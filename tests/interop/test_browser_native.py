"""Headless Chromium's own ``WebSocket`` and ``EventSource`` (no protoflask code in the
page) from a page of another origin, against an embedded server whose allowedOrigins
names that page's origin.

The EventSource test kills its stream from the server side twice (the server ending the
response, then the socket cut under it) while messages keep being sent to the session;
the browser reconnects by itself, sends ``Last-Event-ID`` by itself, and must end up with
every message exactly once, in seq order, in the same session.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from ..support import timeout, wait_for
from .conftest import CHROMIUM_ARGS, HERE, QUIET, need_chromium

PAGE = (HERE / "pages" / "native.html").read_text()


@pytest.fixture
def browser_page(page_server: Any, make_server: Any) -> Any:
    chromium = need_chromium()
    from playwright.sync_api import sync_playwright

    pages = page_server({"/": PAGE})
    server = make_server(allowedOrigins=[pages.origin], **QUIET)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(pages.origin + "/")
            yield server, page
        finally:
            browser.close()


def wait_js(page: Any, expression: str, within: float = 10) -> None:
    page.wait_for_function(expression, timeout=timeout(within) * 1000)


def test_native_websocket_cross_origin(browser_page):
    server, page = browser_page
    token = server.issue_token("chromium-ws")
    page.evaluate("([base, token]) => startWS(base, token)", [server.base_url, token])
    wait_js(page, "ws.messages.some(m => m.type === 'TOOL_DONE')")
    messages = page.evaluate("ws.messages")
    assert [m["type"] for m in messages] == ["HELLO", "TOOL_DONE"]
    assert messages[1]["payload"] == {"call_id": "ws-add", "status": "OK",
                                      "result": {"result": 42}}
    sid = page.evaluate("ws.session")
    assert server.get_session(sid)["userId"] == "chromium-ws"

    # the browser closes, the app sends meanwhile, the browser resumes with the query
    page.evaluate("ws.socket.close(1000)")
    wait_js(page, "ws.closes.length === 1")
    wait_for(lambda: not server.get_session(sid)["connected"], what="the close noticed")
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": "while-away", "role": "agent"}})
    last = messages[-1]["seq"]
    page.evaluate("([base, token, q]) => startWS(base, token, q)",
                  [server.base_url, token, f"&session={sid}&last_seq={last}"])
    wait_js(page, "ws.messages.some(m => m.type === 'MESSAGE_START')")
    replayed = page.evaluate("ws.messages")[2:]
    assert [(m["type"], int(m["seq"])) for m in replayed] == \
        [("MESSAGE_START", int(last) + 1)]
    assert page.evaluate("ws.errors") == 0


def _send(server: Any, sid: str, n: int) -> None:
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": f"m{n}", "role": "agent"}})


def test_native_eventsource_reconnects_and_resumes_without_loss(browser_page):
    server, page = browser_page
    token = server.issue_token("chromium-sse")
    page.evaluate("([base, token]) => startSSE(base, token)", [server.base_url, token])
    wait_js(page, "sse.events.some(e => e.msg.type === 'HELLO')")
    sid = page.evaluate("sse.sessions[0]")
    sent = 0
    for _ in range(3):
        sent += 1
        _send(server, sid, sent)
    wait_js(page, f"sse.events.filter(e => e.msg.type === 'MESSAGE_START').length === {sent}")

    # 1: the server ends the response (as a restart or a drain would)
    server.close_all_connections()
    wait_for(lambda: not server.get_session(sid)["connected"], what="the stream ended")
    for _ in range(4):
        sent += 1
        _send(server, sid, sent)
    wait_js(page, f"sse.events.filter(e => e.msg.type === 'MESSAGE_START').length === {sent}",
            within=20)
    assert page.evaluate("sse.opens") >= 2

    # 2: the connection is cut under the stream (no end of response at all)
    transport = server.get_session(sid)["sseResponse"]
    transport.sock.shutdown(socket.SHUT_RDWR)
    for _ in range(4):
        sent += 1
        _send(server, sid, sent)
    wait_js(page, f"sse.events.filter(e => e.msg.type === 'MESSAGE_START').length === {sent}",
            within=20)

    events = page.evaluate("sse.events")
    seqs = [int(e["msg"]["seq"]) for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # every one, once, in order
    assert all(e["lastEventId"] == f"{sid}:{e['msg']['seq']}" for e in events)
    starts = [e["msg"]["payload"]["message_id"] for e in events
              if e["msg"]["type"] == "MESSAGE_START"]
    assert starts == [f"m{n}" for n in range(1, sent + 1)]
    # every reconnect resumed the same session (Last-Event-ID, sent by the browser itself)
    sessions = page.evaluate("sse.sessions")
    assert len(sessions) >= 3 and set(sessions) == {sid}
    assert page.evaluate("sse.opens") >= 3
    assert page.evaluate("sse.posts")[0] == {"status": 202, "body": {"accepted": 1}}
