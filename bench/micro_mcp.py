"""In-process CPU of an MCP ``tools/call`` of the built-in echo on a warm MCP session, beside
a native TOOL_CALL of echo, in one run (docs/PERFORMANCE.md, "MCP").

    python bench/micro_mcp.py [--n 5000] [--repeat 5]

The real Flask app of a ProtoServer is called as a WSGI application, as
bench/micro_http.py does, one request per call (what a closed-loop client on a
keep-alive connection sends: one call in flight):

* **mcp**: ``POST /proto/mcp`` ``tools/call echo`` on a session initialized before the
  clock starts; the JSON answer is read and checked.
* **native-http**: the same call as a native client over HTTP makes it: one TOOL_CALL
  POSTed to ``/proto/sse?session=<id>``, its TOOL_DONE read from the session's SSE stream.
* **native-ws**: a TOOL_CALL frame on a WebSocketConnection (bench/micro_tool.py's path,
  the cheapest native one).

Prints the CPU microseconds per call of each (best of ``--repeat``) and the ratios of
mcp to the native ones; the target is mcp at most 2x native-http. Not the WSGI server's
request parsing (the same for both HTTP rows), nor the syscalls.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from micro_http import HELLO, call, environ, envelope, start_response  # noqa: E402
from micro_ping import make_server  # noqa: E402
from micro_tool import run_once  # noqa: E402

MESSAGE = "hello from the bench"
#: the MCP ratio the project holds itself to (issue 27)
GOAL = 2.0


def mcp_environ(token: str, body: bytes, session_id: str | None) -> dict[str, Any]:
    env = environ("POST", "/proto/mcp", "", token, body)
    env["CONTENT_TYPE"] = "application/json"
    env["HTTP_ACCEPT"] = "application/json, text/event-stream"
    if session_id:
        env["HTTP_MCP_SESSION_ID"] = session_id
        env["HTTP_MCP_PROTOCOL_VERSION"] = "2025-11-25"
    return env


def mcp_once(server: Any, n: int) -> float:
    app = server.app
    token = server.issue_token("micro")
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}}}
    call(app, mcp_environ(token, orjson.dumps(init), None))
    sid = start_response.headers["Mcp-Session-Id"]  # type: ignore[attr-defined]
    bodies = [orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                            "params": {"name": "echo", "arguments": {"message": MESSAGE}}})
              for i in range(1, n + 1)]
    envs = [mcp_environ(token, body, sid) for body in bodies]
    t0 = time.process_time()
    for env in envs:
        answer = call(app, env)
        assert b'"structuredContent":{"echoed"' in answer, answer
    spent = time.process_time() - t0
    call(app, {**mcp_environ(token, b"", sid), "REQUEST_METHOD": "DELETE"})
    return spent


def native_http_once(server: Any, n: int) -> float:
    app = server.app
    token = server.issue_token("micro")
    down = app(environ("GET", "/proto/sse", "", token), start_response)
    chunks = iter(down)
    first = next(chunks)  # "event: session" with data {"session": "<id>"}
    sid = orjson.loads(first.split(b"data: ", 1)[1].split(b"\n", 1)[0])["session"]
    query = f"session={sid}"
    hello = orjson.dumps({**envelope(sid, 1, "HELLO", HELLO), "payload": {
        **HELLO, "accept_events": ["TOOL_DONE"]}}) + b"\n"
    call(app, environ("POST", "/proto/sse", query, token, hello))
    got = b""
    while b'"type":"HELLO"' not in got:
        got += next(chunks)
    bodies = [orjson.dumps({"id": f"c-{seq}", "session": sid, "seq": str(seq),
                            "ts": str(int(time.time() * 1000)), "type": "TOOL_CALL",
                            "channel": "USER", "payload": {
                                "call_id": f"t-{seq}", "tool": "echo",
                                "params": {"message": MESSAGE}}})
              for seq in range(2, n + 2)]
    envs = [environ("POST", "/proto/sse", query, token, body) for body in bodies]
    t0 = time.process_time()
    for env in envs:
        status = call(app, env)
        assert status.startswith(b'{"accepted":1'), status
        chunk = next(chunks)
        assert b'"echoed"' in chunk, chunk
    spent = time.process_time() - t0
    down.close()
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    server = make_server(None)
    server.engine.ensure_running()
    rows = {
        "mcp": lambda: mcp_once(server, args.n),
        "native-http": lambda: native_http_once(server, args.n),
        "native-ws": lambda: run_once(server, args.n, "tool")[0],
    }
    us = {name: min(run() for _ in range(args.repeat)) / args.n * 1e6
          for name, run in rows.items()}
    if args.json:
        print(orjson.dumps({"us_per_call": us, "calls": args.n}).decode())
        return
    for name, value in us.items():
        print(f"{name}: {value:.1f} us/call")
    ratio = us["mcp"] / us["native-http"]
    print(f"MCP tools/call echo, x a native TOOL_CALL over HTTP: {ratio:.2f}x "
          f"(goal <= {GOAL:g}x: {'PASS' if ratio <= GOAL else 'FAIL'})")
    print(f"MCP tools/call echo, x a native TOOL_CALL over WebSocket: "
          f"{us['mcp'] / us['native-ws']:.2f}x (info)")


if __name__ == "__main__":
    main()
