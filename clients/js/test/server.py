"""A live protoflask for the TypeScript client's tests: a ProtoServer on a free port with
a known secret and a few tools. argv[1] is a JSON object of configuration overrides.
Prints one JSON line {"url", "token"} when it is serving, then serves until its stdin
closes (the test process ends it that way, or by a signal)."""

from __future__ import annotations

import json
import sys

import gevent

from protoflask import ProtoServer, Tool

SECRET = "ts-client-tests-secret-0123456789abcdef"


def main() -> None:
    overrides = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    config = {"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET, "enableLogging": False,
              **overrides}
    server = ProtoServer(config)

    def slow(params: dict, session_id: str, call_id: str, srv: ProtoServer) -> dict:
        steps = int(params.get("steps", 10))
        for i in range(steps):
            srv.send_tool_update(session_id, call_id, "RUNNING", (i + 1) * 100 / steps)
            gevent.sleep(params.get("delay_ms", 50) / 1000)
        return {"steps": steps}

    def stream_text(params: dict, session_id: str, call_id: str, srv: ProtoServer) -> dict:
        """A streamed text of `parts` PARTs on AGENT; with `kick_at`, every live transport
        is closed (as a failing proxy would) after that many parts, mid-text."""
        parts = int(params["parts"])
        kick_at = params.get("kick_at")
        mid = f"stream-{call_id}"
        send = srv.send_message
        send(session_id, {"type": "MESSAGE_START", "channel": "AGENT",
                          "payload": {"message_id": mid, "content_type": "text/plain"}})
        for i in range(parts):
            if i == kick_at:
                srv.close_all_connections()
            send(session_id, {"type": "MESSAGE_PART", "channel": "AGENT",
                              "payload": {"message_id": mid, "content": f"p{i} "}})
            if i % 10 == 0:
                gevent.sleep(0.005)
        send(session_id, {"type": "MESSAGE_END", "channel": "AGENT",
                          "payload": {"message_id": mid}})
        return {"parts": parts, "message_id": mid}

    def model(params: dict, session_id: str, call_id: str, srv: ProtoServer) -> dict:
        """A fake model's reply of `tokens` tokens (`delay_ms` apart) sent with
        server.stream_text, in the run `run_id` if given; returns what stream_text sent."""
        tokens, delay = int(params["tokens"]), params.get("delay_ms", 0) / 1000

        def fake_model():
            for i in range(tokens):
                if delay:
                    gevent.sleep(delay)
                yield f"t{i} "
        sent = srv.stream_text(session_id, fake_model(), run_id=params.get("run_id"))
        return {"message_id": sent.message_id, "parts": sent.parts, "chars": len(sent.text),
                "stopped": sent.stopped}

    def fail(params: dict, session_id: str, call_id: str, srv: ProtoServer) -> dict:
        raise RuntimeError("this tool always fails")

    server.register_tool(Tool("slow", "Reports progress for a while.", {"type": "object"},
                              execute=slow))
    server.register_tool(Tool("stream_text", "Streams a text of N parts.", {
        "type": "object", "properties": {"parts": {"type": "integer"},
                                         "kick_at": {"type": "integer"}},
        "required": ["parts"]}, execute=stream_text))
    server.register_tool(Tool("model", "Streams a fake model's reply with stream_text.", {
        "type": "object", "properties": {"tokens": {"type": "integer"},
                                         "delay_ms": {"type": "number"},
                                         "run_id": {"type": "string"}},
        "required": ["tokens"]}, execute=model))
    server.register_tool(Tool("fail", "Always fails.", {"type": "object"}, execute=fail))
    server.start()
    print(json.dumps({"url": f"http://127.0.0.1:{server.port}",
                      "token": server.issue_token("ts-user"),
                      "other_token": server.issue_token("ts-other")}), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
