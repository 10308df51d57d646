"""A real browser (headless Chromium via Playwright) speaks the protocol over SSE: it opens
an EventSource, POSTs HELLO and a TOOL_CALL with fetch(), and sees the HELLO reply and the
TOOL_DONE. The page is tests/fixtures/sse_page.html, served by the test's own Flask app
(same origin as /proto/*, as a ProtoServer mounted on an application would be)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flask import Flask, Response

from ..support import timeout

CHROMIUM = "/usr/bin/chromium"
PAGE = Path(__file__).resolve().parent.parent / "fixtures" / "sse_page.html"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]



def require_chromium() -> None:
    """Skip without the browser, unless CI (.ci/run) says it must be there."""
    if os.path.exists(CHROMIUM):
        return
    reason = f"{CHROMIUM} is absent (install the Debian package 'chromium')"
    if os.environ.get("PROTOFLASK_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " and PROTOFLASK_REQUIRE_BROWSER=1")
    pytest.skip(reason)


def test_eventsource_and_fetch_in_chromium(make_server):
    require_chromium()
    from playwright.sync_api import sync_playwright

    app = Flask("browser-fixture")

    @app.get("/")
    def page() -> Response:
        return Response(PAGE.read_text(), mimetype="text/html")

    server = make_server(app=app)
    token = server.issue_token("browser-user")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{server.base_url}/?token={token}")
            # the TOOL_DONE event may arrive before the fetch() that POSTed the call resolves
            page.wait_for_function(
                "window.received.some(r => r.msg.type === 'TOOL_DONE')"
                " && window.posts.length >= 2",
                timeout=timeout(10) * 1000)
            received = page.evaluate("window.received")
            posts = page.evaluate("window.posts")
            session_id = page.evaluate("window.sessionId")
        finally:
            browser.close()

    hello = next(r for r in received if r["msg"]["type"] == "HELLO")
    assert hello["msg"]["payload"]["session"] == session_id
    assert hello["msg"]["payload"]["last_client_seq"] == "0"
    assert hello["lastEventId"] == f"{session_id}:{hello['msg']['seq']}"
    done = next(r for r in received if r["msg"]["type"] == "TOOL_DONE")
    assert done["msg"]["payload"] == {"call_id": "browser-call", "status": "OK",
                                      "result": {"echoed": "from chromium"}}
    assert done["lastEventId"] == f"{session_id}:{done['msg']['seq']}"
    assert posts[:2] == [{"status": 202, "body": {"accepted": 1}}] * 2
    snapshot = server.get_session(session_id)
    assert snapshot["userId"] == "browser-user" and snapshot["handshakeCompleted"] is True
