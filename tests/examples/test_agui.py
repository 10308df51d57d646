"""examples/agui: the AG-UI agent and its page, in headless Chromium, with the published
@ag-ui/client (the page's import of it answered by tests/agui/node's bundle): a streamed
reply with a server tool's progress and result, and a frontend tool call the user
confirms in a dialog, answered in the next run."""

from __future__ import annotations

from typing import Any

from ..agui.conftest import client_bundle
from ..interop.conftest import CHROMIUM_ARGS, need_chromium
from ..support import timeout

CLIENT_URL = "https://client.invalid/ag-ui-client.mjs"


def test_agui_example_page(serve_example: Any) -> None:
    chromium = need_chromium()
    from playwright.sync_api import sync_playwright

    bundle = client_bundle("esm")
    server = serve_example("agui", AGENT_TOKEN_DELAY=0.005, AGUI_CLIENT_URL=CLIENT_URL)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout(30) * 1000)
            page.route(CLIENT_URL, lambda route: route.fulfill(
                body=bundle, content_type="text/javascript",
                headers={"Access-Control-Allow-Origin": "*"}))
            questions: list[str] = []

            def confirm(dialog: Any) -> None:
                questions.append(dialog.message)
                dialog.accept()
            page.on("dialog", confirm)
            page.goto(f"{server.base_url}/agui?token={server.issue_token('page')}")
            page.click("button")
            page.wait_for_function("document.querySelectorAll('#log .done').length === 1")
            log = page.inner_text("#log")
            assert "You asked: What is the weather?" in log
            assert "progress 100%" in log and '"forecast":"sunny"' in log
            assert "Paris: sunny, up to 24 C." in log

            page.fill("#text", "book a table")
            page.click("button")
            page.wait_for_function("document.querySelectorAll('#log .done').length === 3")
            assert questions == ["Book this: book a table?"]
            assert "Understood: booked." in page.inner_text("#log")
        finally:
            browser.close()
