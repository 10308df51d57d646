"""examples/mcp: the application's tools reach the official MCP Python client: listed
with their schemas, the long-running report with every section as progress, the quick
word count."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ..mcp.conftest import mcp_session

pytest.importorskip("mcp")


def test_report_progress_and_word_count(serve_example) -> None:
    server = serve_example("mcp", REPORT_SECTION_SECONDS=0.01)
    token = server.issue_token("example")
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def main() -> Any:
        async with mcp_session(f"{server.base_url}/proto/mcp", token) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            report = await session.call_tool("report", {"topic": "tides"},
                                             progress_callback=on_progress)
            words = await session.call_tool("word_count", {"text": "one two three"})
            return tools, report, words

    tools, report, words = anyio.run(main)
    assert {"report", "word_count", "echo", "add"} <= set(tools)
    assert tools["report"].output_schema["required"] == ["topic", "sections"]
    assert report.structured_content["sections"][0] == "summary: tides"
    assert progress == [(25.0, "summary"), (50.0, "findings"), (75.0, "risks"),
                        (100.0, "next steps")]
    assert words.structured_content == {"words": 3}
