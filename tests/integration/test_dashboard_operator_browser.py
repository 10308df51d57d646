"""The dashboard's operator controls in Chromium against a live server with a real
connected client: absent when the server has no operatorToken; with one, the operator
types the token (kept in sessionStorage, never in a URL), sees every session, and the
row's Send, the Broadcast form and the row's Disconnect really reach the client. On a
400 px screen, controls shown, the page does not scroll sideways."""

from __future__ import annotations

from ..support import WSClient, wait_for
from .test_dashboard_browser import browser, screenshot, wait_js  # noqa: F401 - the fixture
from .test_dashboard_operator import OPERATOR
from .test_narrow_screen import OVERFLOW


def open_page(browser, server, width: int = 1280):  # noqa: F811 - the fixture
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(f"{server.base_url}/dashboard")
    return page, problems, urls


def test_no_operator_controls_without_the_setting(browser, server):  # noqa: F811
    page, problems, _ = open_page(browser, server)
    wait_js(page, "!!window.dashboardData", what="the first poll")
    wait_js(page, "performance.getEntriesByType('resource')"
                  ".some(e => e.name.endsWith('/dashboard/operator'))", what="the page asked")
    assert page.evaluate("document.getElementById('operator').hidden")
    assert page.evaluate("document.querySelectorAll('button[data-action]').length") == 0
    assert not problems


def test_operator_sends_broadcasts_and_disconnects(browser, make_server):  # noqa: F811
    server = make_server(operatorToken=OPERATOR)
    client = WSClient(server.base_url, server.issue_token("alice"))
    try:
        client.hello()
        page, problems, urls = open_page(browser, server, width=400)
        wait_js(page, "!document.getElementById('operator').hidden", what="operator controls")
        page.fill("#operator-token", OPERATOR)
        page.dispatch_event("#operator-token", "change")
        row = f"tr[data-session='{client.session_id}']"
        wait_js(page, f"!!document.querySelector(\"{row} button[data-action='send']\")",
                what="the session's operator buttons")
        assert page.evaluate("document.getElementById('sessions-note').textContent") \
            .startswith("All sessions (operator)")
        screenshot(page, "dashboard-operator-400px")
        assert page.evaluate(OVERFLOW) == 0, "the dashboard scrolls sideways"

        page.fill("#operator-type", "OPERATOR_NOTICE")
        page.fill("#operator-payload", '{"text": "just for you"}')
        page.click(f"{row} button[data-action='send']")
        got = client.recv_type("OPERATOR_NOTICE")
        assert got["payload"] == {"text": "just for you"} and got["channel"] == "AGENT"
        wait_js(page, "document.getElementById('operator-status').textContent"
                      ".startsWith('sent OPERATOR_NOTICE')", what="the send reported")

        page.fill("#operator-payload", '{"text": "to everyone"}')
        page.click("#operator-broadcast")
        assert client.recv_type("OPERATOR_NOTICE")["payload"] == {"text": "to everyone"}
        wait_js(page, "document.getElementById('operator-status').textContent"
                      ".includes('reached 1')", what="the broadcast reported")

        page.fill("#operator-payload", "not json")
        page.click("#operator-broadcast")
        wait_js(page, "document.getElementById('operator-status').classList.contains('bad')",
                what="the bad payload reported")

        page.click(f"{row} button[data-action='disconnect']")
        wait_for(lambda: not client.is_open(), what="the client disconnected")
        assert client.close_code == 1001
        wait_js(page, "document.getElementById('operator-status').textContent"
                      f".startsWith('disconnected {client.session_id}')")

        assert page.evaluate("sessionStorage.getItem('protoflask-operator-token')") == OPERATOR
        assert not [u for u in urls if OPERATOR in u], "the operator token reached a URL"
        assert not problems, problems
    finally:
        client.close()
