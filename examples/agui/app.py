"""An AG-UI agent on protoflask, and a page that talks to it with the published
``@ag-ui/client`` HttpAgent (docs/AGUI.md).

The agent streams a reply from a fake model, calls its ``forecast`` tool server-side
(the page shows the tool's progress and result), and, when asked to book something,
calls the page's own ``confirm`` tool (a frontend tool call: the run ends with the call,
the page asks the user and sends the answer in the next run). The page's Stop button
uses the stop extension; a stream that breaks can be re-attached (GET /proto/agui).

Run it (from the repository root), then open the URL it prints:

    PROTOFLASK_DEV=1 python examples/agui/app.py
    JWT_SECRET=change-me gunicorn -k gevent --chdir examples/agui app:app
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import gevent
from flask import Flask, Response

from protoflask import ProtoServer

PAGE = (Path(__file__).resolve().parent / "page.html").read_text()
#: Where the page loads HttpAgent from (any ES module build of @ag-ui/client 1.0).
CLIENT_URL = "https://esm.sh/@ag-ui/client@1.0.0"


def fake_model(prompt: str, delay: float) -> Iterator[str]:
    """Stands in for a streaming model client: the reply, token by token."""
    for word in f"You asked: {prompt}. Let me look at the forecast.".split():
        gevent.sleep(delay)
        yield word + " "


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(AGENT_TOKEN_DELAY=0.05, AGUI_CLIENT_URL=CLIENT_URL)
    app.config.update(config or {})
    proto = ProtoServer(app=app)
    delay = app.config["AGENT_TOKEN_DELAY"]

    @proto.tool("forecast", input_schema={"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}})
    def forecast(params: dict[str, Any], session_id: str, call_id: str, server: Any) -> Any:
        for pct in (25, 50, 75, 100):
            gevent.sleep(delay)
            server.send_tool_update(session_id, call_id, "RUNNING", pct)
        return {"city": params["city"], "forecast": "sunny", "high": 24}

    @proto.agui_handler
    def answer(run: Any) -> Any:
        last = run.messages[-1] if run.messages else {}
        if last.get("role") == "tool":  # the page answered our confirm call
            verdict = "booked" if last.get("content") == "yes" else "not booked"
            run.stream_text([f"Understood: {verdict}."])
            return {"booked": verdict == "booked"}
        prompt = run.last_user_text or ""
        if "book" in prompt.lower() and any(t["name"] == "confirm" for t in run.tools):
            run.stream_text(["I need your confirmation first."])
            run.call_frontend_tool("confirm", {"question": f"Book this: {prompt}?"})
            return None
        run.stream_text(fake_model(prompt, delay))
        weather = run.call_tool("forecast", {"city": "Paris"})
        run.set_state({"lastForecast": weather})
        run.stream_text([f"Paris: {weather['forecast']}, up to {weather['high']} C."])
        return weather

    @app.get("/agui")
    def page() -> Response:
        return Response(PAGE.replace("__CLIENT_URL__", app.config["AGUI_CLIENT_URL"]),
                        mimetype="text/html")

    return app


app = create_app()  # gunicorn -k gevent app:app


def main() -> None:
    proto: ProtoServer = app.extensions["protoflask"]
    proto.start()
    token = proto.dev_token or "<a token>"
    print(f"open http://127.0.0.1:{proto.port}/agui?token={token}")
    proto.serve_forever()


if __name__ == "__main__":
    main()
