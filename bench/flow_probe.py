"""Flow-control figures that tests must not time (docs/RELIABILITY.md, section 19):

    python bench/flow_probe.py [runs]

1. back-pressure: tests/client's scenario (outboundBufferSize 1024, the client grants 2
   downstream credits at a time, 40 texts pushed, 30 texts sent, each echoed), per
   transport and run: PAUSE/RESUME pairs, ERRORs, client messages, whether it completed
   within 20 s;
2. a client announcing initial_credit_messages 10 without asking for downstream credit:
   TOOL_DONEs received out of 2,000 sequential calls (WebSocket, 10 s budget per answer);
3. 50 tool calls POSTed concurrently, shuffled, on the SSE upstream: TOOL_DONEs received.

Runs the embedded server in this process; prints one JSON object per line.
"""

from __future__ import annotations

import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protoflask import ProtoServer  # noqa: E402
from protoflask.client import Client  # noqa: E402
from tests.support import SSEClient, WSClient, hello_payload  # noqa: E402

SECRET = "flow-probe-secret-0123456789abcdef"


def server(**config) -> ProtoServer:
    srv = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                       "enableLogging": False, "allowedOrigins": ["*"], **config})
    srv.start()
    srv.base_url = f"http://127.0.0.1:{srv.port}"  # type: ignore[attr-defined]
    return srv


def agent_text(srv, sid: str, mid: str, part: str) -> None:
    srv.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                           "payload": {"message_id": mid, "content_type": "text/plain"}})
    srv.send_message(sid, {"type": "MESSAGE_PART", "channel": "AGENT",
                           "payload": {"message_id": mid, "content": part}})
    srv.send_message(sid, {"type": "MESSAGE_END", "channel": "AGENT",
                           "payload": {"message_id": mid}})


def back_pressure(transport: str) -> dict:
    srv = server(outboundBufferSize=1024)
    seen: dict[str, int] = {}
    client = Client(srv.base_url, srv.issue_token("probe"), transport=transport,
                    credit_messages=2, timeout=5,
                    on_message=lambda m: seen.__setitem__(m["type"], seen.get(m["type"], 0) + 1))
    try:
        client.connect()
        for n in range(40):
            agent_text(srv, client.session_id, f"d{n}", "x" * 100)
        for n in range(30):
            client.send_text(f"up {n}")
        started, texts = time.monotonic(), 0
        try:
            while texts < 70:
                client.next_text(timeout=max(0.1, 20 - (time.monotonic() - started)))
                texts += 1
        except Exception:  # noqa: BLE001 - a stall is a result here
            pass
        return {"probe": "back_pressure", "transport": transport, "texts": f"{texts}/70",
                "pauses": seen.get("PAUSE_CHANNEL", 0), "resumes": seen.get("RESUME_CHANNEL", 0),
                "errors": seen.get("ERROR", 0), "client_messages": client._seq,
                "seconds": round(time.monotonic() - started, 2)}
    finally:
        client.close(flush_timeout=1)
        srv.stop()


def silent_credit() -> dict:
    srv = server()
    ws = WSClient(srv.base_url, srv.issue_token("probe"))
    done = 0
    started = time.monotonic()
    try:
        ws.send("HELLO", "SYSTEM", hello_payload(
            capabilities={"flow_control": {"initial_credit_messages": 10}}))
        ws.recv_type("HELLO")
        for n in range(2000):
            ws.send("TOOL_CALL", payload={"call_id": f"c{n}", "tool": "echo",
                                          "params": {"message": "x"}})
            ws.recv_type("TOOL_DONE", within=10)
            done += 1
    except AssertionError:
        pass
    finally:
        ws.close()
        srv.stop()
    return {"probe": "announces_10_never_grants", "tool_done": f"{done}/2000",
            "seconds": round(time.monotonic() - started, 2)}


def concurrent_posts() -> dict:
    srv = server()
    token = srv.issue_token("probe")
    sse = SSEClient(srv.base_url, token)
    got = 0
    try:
        sse.hello()
        bodies = [orjson.dumps({"id": f"m{seq}", "session": sse.session_id, "seq": str(seq),
                                "ts": "1", "type": "TOOL_CALL", "channel": "USER",
                                "payload": {"call_id": f"c{seq}", "tool": "echo",
                                            "params": {"message": "x"}}})
                  for seq in range(2, 52)]
        random.shuffle(bodies)

        def post(body: bytes) -> int:
            return requests.post(f"{srv.base_url}/proto/sse?session={sse.session_id}",
                                 data=body, timeout=10,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"}).status_code

        with ThreadPoolExecutor(max_workers=25) as pool:
            statuses = sorted(set(pool.map(post, bodies)))
        try:
            while got < 50:
                sse.recv_type("TOOL_DONE", within=3)
                got += 1
        except AssertionError:
            pass
    finally:
        sse.close()
        srv.stop()
    return {"probe": "50_concurrent_sse_posts", "statuses": statuses, "tool_done": f"{got}/50"}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for _ in range(runs):
        for transport in ("ws", "sse", "stream"):
            print(json.dumps(back_pressure(transport)), flush=True)
    print(json.dumps(silent_credit()), flush=True)
    print(json.dumps(concurrent_posts()), flush=True)


if __name__ == "__main__":
    main()
