"""Server CPU per streamed event: an AG-UI run's TEXT_MESSAGE_CONTENT against a native
MESSAGE_PART, in one run (docs/AGUI.md; the target is a ratio of at most 1.5).

    python bench/agui_events.py [--events 20000] [--repeat 3]

A protoflask server runs in a process of its own (``--serve``); this process is the
client. Both sides stream the same text the same way, ``stream_text`` with one part per
chunk (``max_delay_ms=0``), so each chunk is one event on the wire:

* native: an SSE stream (``GET /proto/sse``) whose session calls the ``emit`` tool,
  which streams the chunks; the client reads until the MESSAGE_END;
* AG-UI: ``POST /proto/agui`` whose handler streams the same chunks; the client reads
  until RUN_FINISHED;

and the same pair on the WebSocket: a native socket whose session calls ``emit``, and a
socket that asks for AG-UI events (HELLO ``capabilities.extensions: ["agui"]``) and starts
the run with a RunAgentInput in ``RUN_STARTED`` (one AGUI_EVENT envelope a frame).

The server process's CPU time (utime + stime, /proc/<pid>/stat) is read before and after
each, and divided by the number of events; best of ``--repeat``. Prints both figures and
the ratio, and writes them as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECRET = "agui-bench-secret-that-is-long-enough!"
TICKS = os.sysconf("SC_CLK_TCK")


def serve(port: int) -> None:
    """The server: ``emit`` (native) and an AG-UI handler stream ``n`` chunks."""
    from protoflask import ProtoServer

    server = ProtoServer({"port": port, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False, "heartbeatInterval": 600000,
                          "heartbeatTimeout": 600000, "replayWindowSize": 100000,
                          "replayWindowBytes": 1 << 30})

    import gevent

    def chunks(n: int) -> Any:
        """A fast model: a token at a time, the writer given a turn every 50 (a model
        that never yields would fill the session's pending queue on either path)."""
        for i in range(n):
            if i % 50 == 0:
                gevent.sleep(0)
            yield f"token {i} "

    @server.tool("emit", input_schema={"type": "object"})
    def emit(params: dict[str, Any], session_id: str, call_id: str, srv: Any) -> Any:
        sent = srv.stream_text(session_id, chunks(int(params["n"])), max_delay_ms=0)
        return {"parts": sent.parts}

    @server.agui_handler
    def answer(run: Any) -> Any:
        sent = run.stream_text(chunks(int(run.forwarded_props["n"])), max_delay_ms=0)
        return {"parts": sent.parts}

    server.start()
    print(json.dumps({"port": server.port, "token": server.issue_token("bench")}), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = bytearray()
    while marker not in data[-4096:]:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("the server closed the stream early")
        data += chunk
    return bytes(data)


def request(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def native(port: int, token: str, n: int) -> int:
    """One SSE stream whose session streams n MESSAGE_PARTs; returns how many came."""
    import requests

    sock = request(port, f"GET /proto/sse HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         f"{token}\r\nAccept: text/event-stream\r\n")
    head = read_until(sock, b'"session":"')
    session = head.split(b'"session":"', 1)[1].split(b'"', 1)[0].decode()
    envelopes = [
        {"id": "h", "session": "", "seq": "1", "ts": "1", "type": "HELLO", "channel": "SYSTEM",
         "payload": {"proto_version": "1.1.2", "accept_major": [1]}},
        {"id": "c", "session": "", "seq": "2", "ts": "1", "type": "TOOL_CALL",
         "channel": "USER", "payload": {"call_id": "emit", "tool": "emit", "params": {"n": n}}}]
    requests.post(f"http://127.0.0.1:{port}/proto/sse?session={session}", timeout=30,
                  data="\n".join(json.dumps(e) for e in envelopes),
                  headers={"Authorization": f"Bearer {token}",
                           "Content-Type": "application/x-ndjson"}).raise_for_status()
    data = read_until(sock, b'"type":"TOOL_DONE"')
    sock.close()
    return data.count(b'"type":"MESSAGE_PART"')


def agui(port: int, token: str, n: int, run: int) -> int:
    """One AG-UI run of n TEXT_MESSAGE_CONTENTs; returns how many came."""
    body = json.dumps({"threadId": f"bench-{run}", "runId": f"r{run}", "messages": [
        {"id": "m", "role": "user", "content": "go"}], "forwardedProps": {"n": n}}).encode()
    sock = request(port, f"POST /proto/agui HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         f"{token}\r\nContent-Type: application/json\r\n", body)
    data = read_until(sock, b'"type":"RUN_FINISHED"')
    sock.close()
    return data.count(b'"type":"TEXT_MESSAGE_CONTENT"')


HELLO = {"id": "h", "session": "", "seq": "1", "ts": "1", "type": "HELLO", "channel": "SYSTEM",
         "payload": {"proto_version": "1.1.2", "accept_major": [1]}}


def on_socket(port: int, token: str, first: dict[str, Any], hello: dict[str, Any],
              marker: str, counted: str) -> int:
    """A WebSocket: HELLO, then ``first``; frames read until one holds ``marker``; returns
    how many held ``counted``."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/proto/websocket?token={token}", compression=None,
                 max_size=None) as ws:
        ws.send(json.dumps(hello))
        ws.send(json.dumps(first))
        count = 0
        while True:
            frame = ws.recv()
            if counted in frame:
                count += 1
            elif marker in frame:
                return count


def native_ws(port: int, token: str, n: int) -> int:
    """A native socket whose session streams n MESSAGE_PARTs."""
    call = {"id": "c", "session": "", "seq": "2", "ts": "1", "type": "TOOL_CALL",
            "channel": "USER", "payload": {"call_id": "emit", "tool": "emit", "params": {"n": n}}}
    return on_socket(port, token, call, HELLO, '"type":"TOOL_DONE"', '"type":"MESSAGE_PART"')


def agui_ws(port: int, token: str, n: int, run: int) -> int:
    """An AG-UI run of n TEXT_MESSAGE_CONTENTs on a socket that asked for the extension."""
    hello = {**HELLO, "payload": {**HELLO["payload"],
                                  "capabilities": {"extensions": ["agui"]}}}
    start = {"id": "r", "session": "", "seq": "2", "ts": "1", "type": "RUN_STARTED",
             "channel": "USER", "payload": {"run_id": f"w{run}", "thread_id": "bench",
                                            "metadata": {"agui": {
                                                "messages": [{"id": "m", "role": "user",
                                                              "content": "go"}],
                                                "forwardedProps": {"n": n}}}}}
    return on_socket(port, token, start, hello, '"type":"RUN_FINISHED"',
                     '"type":"TEXT_MESSAGE_CONTENT"')


PATHS = {"native": lambda port, token, n, r: native(port, token, n), "agui": agui,
         "native_ws": lambda port, token, n, r: native_ws(port, token, n), "agui_ws": agui_ws}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        port, token = info["port"], info["token"]
        for run_path in PATHS.values():  # warm every path (imports, first sessions)
            run_path(port, token, 500, -1)
        best: dict[str, float] = {}
        for r in range(args.repeat):
            for name, run_path in PATHS.items():
                before = cpu_seconds(proc.pid)
                got = run_path(port, token, args.events, r)
                used = cpu_seconds(proc.pid) - before
                if got != args.events:
                    raise RuntimeError(f"{name}: {got} events of {args.events}")
                per_event = used / got * 1e6
                best[name] = min(best.get(name, per_event), per_event)
                time.sleep(0.2)
        # CPU time comes in clock ticks (10 ms): too few events can measure 0
        ratio = best["agui"] / best["native"] if best["native"] else None
        ws_ratio = best["agui_ws"] / best["native_ws"] if best["native_ws"] else None
        result = {"events": args.events, "native_us_per_event": round(best["native"], 2),
                  "agui_us_per_event": round(best["agui"], 2),
                  "ratio": None if ratio is None else round(ratio, 3),
                  "native_ws_us_per_event": round(best["native_ws"], 2),
                  "agui_ws_us_per_event": round(best["agui_ws"], 2),
                  "ws_ratio": None if ws_ratio is None else round(ws_ratio, 3),
                  "target_ratio": 1.5, "met": ratio is not None and ratio <= 1.5
                  and ws_ratio is not None and ws_ratio <= 1.5}
        for label, a, b, r_ in (("SSE", "native", "agui", ratio),
                                ("WebSocket", "native_ws", "agui_ws", ws_ratio)):
            verdict = "too few events to tell" if r_ is None else \
                f"ratio {r_:.2f} (target <= 1.5: {'met' if r_ <= 1.5 else 'NOT met'})"
            print(f"server CPU per event, {label}: native MESSAGE_PART {best[a]:.2f} µs, "
                  f"AG-UI TEXT_MESSAGE_CONTENT {best[b]:.2f} µs, {verdict}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
