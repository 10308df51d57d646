"""The page at / on a phone-sized screen (400 px wide) in Chromium: neither the dashboard
(cards, charts, the sessions and tools tables filled) nor the playground (connected, a
tool form shown) scrolls sideways; wide tables scroll inside their own box. And at
1280 px neither does anything."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from ..support import WSClient
from .test_dashboard_browser import (
    ARTIFACTS, PROGRESS_SCHEMA, browser, screenshot, wait_js,  # noqa: F401 - the fixture
)

USER = "a-user-with-a-long-identifier@example.org"  # its own sessions are listed
#: how far the page scrolls sideways (0: it does not)
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.fixture
def busy_server(make_server: Any) -> Iterator[Any]:
    """A server with a long-named user connected (a wide sessions row) and a tool with a
    schema (a wide tools row)."""
    from protoflask import Tool

    server = make_server()
    server.register_tool(Tool("progress_with_a_rather_long_name", "Reports progress. " * 8,
                              PROGRESS_SCHEMA, execute=lambda *a: {}))
    client = WSClient(server.base_url, server.issue_token(USER))
    client.hello()
    try:
        yield server
    finally:
        client.close()


@pytest.mark.parametrize("width", [400, 1280])
def test_no_sideways_scroll(browser, busy_server, width):  # noqa: F811 - the fixture
    server = busy_server
    token = server.issue_token(USER)
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(f"{server.base_url}/#token={token}")
    wait_js(page, "document.querySelectorAll('#sessions tbody tr[data-session]').length >= 1",
            what="a session in the sessions table")
    wait_js(page, "document.querySelectorAll('#tools tbody tr').length >= 1", what="the tools")
    screenshot(page, f"dashboard-{width}px")
    assert page.evaluate(OVERFLOW) == 0, "the dashboard scrolls sideways"
    # the charts fit, and a table too wide for the screen scrolls inside its box
    assert page.evaluate("Math.max(...[...document.querySelectorAll('canvas')]"
                         ".map(c => c.getBoundingClientRect().right))") <= width
    if width == 400:
        assert page.evaluate("(() => { const w = document.getElementById('sessions')"
                             ".parentElement; return w.scrollWidth > w.clientWidth; })()")

    page.click("#tab-playground")
    page.click("#connect")
    wait_js(page, "document.getElementById('conn-status').dataset.state === 'ready'",
            what="the handshake")
    page.select_option("#tool-select", "progress_with_a_rather_long_name")
    wait_js(page, "!!document.getElementById('param-label')", what="the tool form")
    screenshot(page, f"playground-{width}px")
    assert page.evaluate(OVERFLOW) == 0, "the playground scrolls sideways"
    assert ARTIFACTS.exists()
