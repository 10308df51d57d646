"""In-process cost of the HTTP transports' message path, without sockets or a WSGI server
(repeatable to a few percent where bench/run.py moves by +-10 points).

    python bench/micro_http.py [--bodies 400] [--batch 50] [--repeat 5] [--build N]

The real Flask app of a ProtoServer is called as a WSGI application: one SSE downstream
(``GET /proto/sse``) and one NDJSON stream (``POST /proto/stream``) are opened, and then
each round POSTs ``batch`` PINGs as NDJSON to ``?session=<id>`` (what
bench/http_downstream.py does) and takes the next chunk of the streaming response (all
their PONGs). Beside them, the WebSocket's ``WebSocketConnection`` is fed the same
batches as masked frames in one ``recv`` each. Prints the CPU microseconds per message
of each (best of ``--repeat``) and the HTTP / WebSocket ratios. Not gunicorn's request
parsing and chunked writes, nor the syscalls: bench/run.py measures those.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from micro_ping import FakeSocket, frame, make_server, time_read_loop  # noqa: E402

SECRET = "micro-bench-secret-that-is-long-enough!"


def envelope(session: str, seq: int, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"c-{seq}", "session": session, "seq": str(seq),
            "ts": str(int(time.time() * 1000)), "type": type_, "channel": "SYSTEM",
            "payload": payload}


HELLO = {"proto_version": "1.1.2", "accept_major": [1], "capabilities": {"flow_control": {
    "initial_credit_messages": 1_000_000_000, "initial_credit_bytes": 1_000_000_000_000}}}


def ping(session: str, seq: int) -> dict[str, Any]:
    return envelope(session, seq, "PING", {"nonce": f"n-{seq:012d}-abcdefghijklmnop"})


def environ(method: str, path: str, query: str, token: str, body: bytes = b"") -> dict[str, Any]:
    return {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080", "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8080", "HTTP_AUTHORIZATION": f"Bearer {token}",
            "CONTENT_TYPE": "application/x-ndjson", "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0), "wsgi.multithread": False, "wsgi.multiprocess": False,
            "wsgi.run_once": False}


def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    start_response.headers = dict(headers)  # type: ignore[attr-defined]
    return None


def call(app: Any, env: dict[str, Any]) -> bytes:
    result = app(env, start_response)
    try:
        return b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


def http_once(server: Any, transport: str, bodies: int, batch: int, built: int) -> float:
    app = server.app
    token = server.issue_token("micro")
    path = "/proto/sse" if transport == "sse" else "/proto/stream"
    if transport == "sse":
        down = app(environ("GET", path, "", token), start_response)
    else:
        hello = orjson.dumps(envelope("-", 1, "HELLO", HELLO)) + b"\n"
        down = app(environ("POST", path, "", token, hello), start_response)
    chunks = iter(down)
    first = next(chunks)
    sid = start_response.headers["Proto-Session"]  # type: ignore[attr-defined]
    query = f"session={sid}"
    if transport == "sse":
        hello = orjson.dumps(envelope(sid, 1, "HELLO", HELLO)) + b"\n"
        call(app, environ("POST", path, query, token, hello))
    got = first
    while b'"type":"HELLO"' not in got:  # the stream's first chunk may already hold it
        got += next(chunks)
    seq = 2
    payloads = []
    for _ in range(max(bodies, built)):
        payloads.append(b"".join(orjson.dumps(ping(sid, s)) + b"\n"
                                 for s in range(seq, seq + batch)))
        seq += batch
    del payloads[bodies:]
    pongs = 0
    t0 = time.process_time()
    for body in payloads:
        status = call(app, environ("POST", path, query, token, body))
        assert status.startswith(b'{"accepted"'), status
        pongs += next(chunks).count(b'"type":"PONG"')
    spent = time.process_time() - t0
    assert pongs == bodies * batch, pongs
    down.close()
    return spent


def ws_once(server: Any, bodies: int, batch: int, built: int) -> float:
    engine = server.engine
    engine.ensure_running()
    live = engine.new_session("micro")
    hello = frame(envelope(live.id, 1, "HELLO", HELLO))
    seq = 2
    chunks = [hello]
    for _ in range(max(bodies, built)):
        chunks.append(b"".join(frame(ping(live.id, s)) for s in range(seq, seq + batch)))
        seq += batch
    del chunks[bodies + 1:]
    return time_read_loop(engine, live, FakeSocket(chunks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bodies", type=int, default=400)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default="ws,sse,stream")
    ap.add_argument("--build", type=int, default=0,
                    help="build this many bodies (at least --bodies) and send --bodies of "
                         "them: two runs with different --bodies and the same --build differ "
                         "only in what is sent (valgrind --tool=callgrind instruction counts)")
    args = ap.parse_args()
    server = make_server(None)
    n = args.bodies * args.batch
    results = {}
    for name in args.only.split(","):
        if name == "ws":
            best = min(ws_once(server, args.bodies, args.batch, args.build)
                       for _ in range(args.repeat))
        else:
            best = min(http_once(server, name, args.bodies, args.batch,
                                 args.build)
                       for _ in range(args.repeat))
        results[name] = best / n * 1e6
    for name, us in results.items():
        ratio = f" ({us / results['ws']:.2f}x the WebSocket)" if "ws" in results and \
            name != "ws" else ""
        print(f"{name}: {us:.2f} us/msg{ratio}")


if __name__ == "__main__":
    main()
