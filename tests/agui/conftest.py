"""AG-UI tests: a real protoflask server with an AG-UI handler, driven by the published
``@ag-ui/client`` HttpAgent (tests/agui/node, pinned by its lockfile; ``npm ci`` by
.ci/run, or here when node_modules is absent) and by raw HTTP, every emitted event checked
against the ``ag-ui-protocol`` package's event models."""

from __future__ import annotations

import json
import subprocess
import gevent
from pathlib import Path
from typing import Any, Callable

import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from ..interop.conftest import QUIET, missing, need_program
from ..support import timeout

NODE_DIR = Path(__file__).resolve().parent / "node"
EVENT = TypeAdapter(Event)


def validate(event: dict[str, Any]) -> Any:
    """The event, parsed by ag-ui-protocol's models (raises on anything they reject)."""
    return EVENT.validate_python(event)


def need_agui_node() -> str:
    node = need_program("node", "nodejs")
    if not (NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir():
        npm = need_program("npm", "npm")
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            missing(f"npm ci in {NODE_DIR} failed: {proc.stderr[-2000:]}")
    return node


def client_bundle(fmt: str = "iife") -> str:
    """@ag-ui/client for a browser, by tests/agui/node's pinned esbuild: an IIFE whose
    global is ``AGUI``, or an ES module (``fmt="esm"``)."""
    need_agui_node()
    args = [str(NODE_DIR / "node_modules" / ".bin" / "esbuild"), "browser-entry.mjs",
            "--bundle", f"--format={fmt}", "--platform=browser", "--log-level=warning"]
    if fmt == "iife":
        args.append("--global-name=AGUI")
    proc = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
                          check=True)
    return proc.stdout


def run_node(*args: str, within: float = 60) -> list[dict[str, Any]]:
    """``node agent.mjs args...``: its JSON lines (it exits when done)."""
    node = need_agui_node()
    proc = subprocess.run([node, "agent.mjs", *args], cwd=NODE_DIR, capture_output=True,
                          text=True, timeout=timeout(within))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, (proc.stderr[-3000:], lines[-5:])
    return lines


def slow_chunks(n: int = 12, pause: float = 0.04) -> Any:
    for i in range(n):
        gevent.sleep(pause)
        yield f"chunk{i} "


def agent_handler(server: Any) -> Callable[[Any], Any]:
    """What the test agent does, chosen by the last user message."""
    def handle(run: Any) -> Any:
        text = run.last_user_text or ""
        if text == "tool":
            run.stream_text(["Checking the weather"], max_delay_ms=0)
            result = run.call_tool("weather", {"city": "Paris"})
            run.stream_text([f"It is {result['temp']} degrees"], max_delay_ms=0)
            return {"temp": result["temp"]}
        if text == "frontend":
            last = run.messages[-1]
            if last.get("role") == "tool":
                run.stream_text([f"confirmed: {last.get('content')}"], max_delay_ms=0)
                return None
            run.call_frontend_tool("confirm", {"question": "Proceed?"})
            return None
        if text == "slow":
            run.stream_text(slow_chunks(), max_delay_ms=0)
            run.call_tool("weather", {"city": "Oslo"})
            run.stream_text(slow_chunks(4), max_delay_ms=0)
            return None
        if text == "long":  # text only, 20 chunks 40 ms apart
            run.stream_text(slow_chunks(20), max_delay_ms=0)
            return {"chunks": 20}
        if text == "pause":  # 6 chunks, a pause of 1.5 s, 6 more
            def paused() -> Any:
                yield from slow_chunks(6)
                gevent.sleep(1.5)
                yield from (f"later{i} " for i in range(6))
            run.stream_text(paused(), max_delay_ms=0)
            return {"chunks": 12}
        if text == "fail":
            run.stream_text(["about to fail"], max_delay_ms=0)
            raise RuntimeError("the model is unavailable")
        if text == "state":
            run.set_state({"count": 1})
            run.patch_state([{"op": "replace", "path": "/count", "value": 2}])
            return None
        run.stream_text([f"echo: {text}"], max_delay_ms=0)
        return None
    return handle


def weather_tool(server: Any) -> None:
    """A server tool that reports progress before its result."""
    @server.tool("weather", input_schema={"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}})
    def weather(params: dict[str, Any], session_id: str, call_id: str, srv: Any) -> Any:
        srv.send_tool_update(session_id, call_id, progress=50, partial={"city": params["city"]})
        gevent.sleep(0.05)
        return {"temp": 21}


@pytest.fixture
def agui_server(make_server: Callable[..., Any]) -> Any:
    server = make_server(**QUIET)
    weather_tool(server)
    server.agui_handler(agent_handler(server))
    return server
