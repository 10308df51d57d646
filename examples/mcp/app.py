"""Application tools served to MCP clients (docs/MCP.md).

Two tools of its own beside the built-ins: ``report`` (a long-running job that reports
each section it writes as progress, with the section as the progress message, and that
stops cleanly when cancelled) and ``word_count`` (a quick one). Point any MCP client at
``/proto/mcp`` with a token; a 2025-11-25 client may run ``report`` as a task and poll it.

Run it (from the repository root):

    PROTOFLASK_DEV=1 python examples/mcp/app.py          # prints the URL and a token
    JWT_SECRET=change-me gunicorn -k gevent --chdir examples/mcp app:app
    npx @modelcontextprotocol/inspector                   # Streamable HTTP, the URL, Bearer
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import gevent
from flask import Flask

from protoflask import ProtoServer

log = logging.getLogger("mcp-example")

SECTIONS = ["summary", "findings", "risks", "next steps"]


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(REPORT_SECTION_SECONDS=1.0)  # how long each section takes
    app.config.update(config or {})
    proto = ProtoServer(app=app)
    pause = app.config["REPORT_SECTION_SECONDS"]

    @proto.tool(input_schema={"type": "object", "properties": {"topic": {"type": "string"}},
                              "required": ["topic"], "additionalProperties": False},
                output_schema={"type": "object", "properties": {
                    "topic": {"type": "string"},
                    "sections": {"type": "array", "items": {"type": "string"}}},
                    "required": ["topic", "sections"]})
    def report(params: dict[str, Any], session_id: str, call_id: str,
               server: ProtoServer) -> dict[str, Any]:
        """Writes a report on a topic, one section at a time (reports progress)."""
        written: list[str] = []
        try:
            for number, section in enumerate(SECTIONS, 1):
                gevent.sleep(pause)  # the slow part: a model, a search, a build...
                written.append(f"{section}: {params['topic']}")
                server.send_tool_update(session_id, call_id, "RUNNING",
                                        100 * number / len(SECTIONS), partial=section)
        except gevent.GreenletExit:  # cancelled (MCP notifications/cancelled, tasks/cancel)
            log.info("report on %r cancelled after %d sections", params["topic"],
                     len(written))
            raise
        return {"topic": params["topic"], "sections": written}

    @proto.tool(inline=True,
                input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                              "required": ["text"]},
                output_schema={"type": "object", "properties": {"words": {"type": "integer"}},
                               "required": ["words"]})
    def word_count(params: dict[str, Any], *_: Any) -> dict[str, int]:
        """Counts the words of a text."""
        return {"words": len(params["text"].split())}

    return app


app = create_app()  # gunicorn -k gevent app:app


def main() -> None:
    proto: ProtoServer = app.extensions["protoflask"]
    proto.start()
    print(f"MCP endpoint: http://127.0.0.1:{proto.port}/proto/mcp")
    if proto.dev_token:
        print(f"development token (Authorization: Bearer ...): {proto.dev_token}")
    proto.serve_forever()  # until Ctrl-C or SIGTERM


if __name__ == "__main__":
    main()
