"""Instructions per message in a real gunicorn worker, counted by valgrind's callgrind.

    python bench/worker_instructions.py ws|sse|stream|tool|ping [--k1 2] [--k2 6] [--app wsgi:app]
        [--root DIR] [--sim]

Starts ``gunicorn -c gunicorn.conf.py wsgi:app`` under callgrind (the worker is followed
across gunicorn's fork), drives it with 10 sessions that each send ``k`` batches of 50
PINGs (one WebSocket write, or one NDJSON POST to ``?session=``) and wait for the 50
PONGs downstream, stops it and reads the worker's total. Run with k1 and with k2 batches,
the difference over the (k2 - k1) x 500 extra messages is the worker's cost of one
message: gunicorn's request handling, Flask, the protocol and the framing, in user space
(the kernel's share of the syscalls is not counted). Repeatable to about 1% whatever
else the machine is doing, where bench/run.py's CPU times move by 10%. The worker's
timers (heartbeats, gunicorn's own) add about 0.4M instructions per second of the slowed
run, under 2k a message.

``tool``: each session sends its 50 TOOL_CALLs of the built-in echo one at a time over
WebSocket, each after the last one's TOOL_DONE (bench/run.py's tool row: 10 connections,
one call in flight each). ``ping``: the same shape with PINGs, each after the last one's
PONG (bench/run.py's PING row at 10 connections: one write and one read a message, where
``ws`` batches 50 to a write). ``--root``: another checkout's server (e.g. a ``git archive``
of the commit before a change), run by this script. ``--sim``: callgrind's cache and
branch simulation too, every event per message printed (instruction and data cache
misses, mispredicted branches): some of what a clock sees that an instruction count
does not.

gunicorn's optional C request parser (gunicorn_h1c) uses instructions valgrind does not
know: the worker runs with ``--http-parser python``.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import jwt  # noqa: E402

import http_downstream as downstream  # noqa: E402
from _callgrind import events, gunicorn_under_callgrind  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-secret-0123456789abcdef0123456789"
SESSIONS = 10
BATCH = 50
TOOL_DONE = b'"type":"TOOL_DONE"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ws_frame(text: str) -> bytes:
    """A masked text frame (mask key 0: legal, and the server unmasks it all the same)."""
    data = text.encode()
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126
                            else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + b"\0\0\0\0" + data


def tool_call(holder: argparse.Namespace) -> bytes:
    payload = (f'{{"call_id":"t{holder.idx}-{holder.seq}","tool":"echo",'
               '"params":{"message":"hello from the bench"}}')
    return ws_frame(downstream.Session.envelope(holder, "TOOL_CALL", "USER", payload))


def ping(holder: argparse.Namespace) -> bytes:
    return ws_frame(downstream.Session.envelope(holder, "PING", "SYSTEM",
                                                f'{{"nonce":"n{holder.seq}"}}'))


def ws_session(port: int, token: str, batches: int, kind: str = "ws") -> None:
    """``ws``: ``batches`` of BATCH PINGs in one write each; ``tool`` or ``ping``: BATCH x
    ``batches`` TOOL_CALLs or PINGs, each sent once the last one is answered."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall((f"GET /proto/websocket?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    status, _, buf = downstream.read_head(sock)
    if status != 101:
        raise ConnectionError(f"WebSocket upgrade answered {status}")
    envelopes = downstream.Session.envelope
    holder = argparse.Namespace(seq=0, idx=0)
    sock.sendall(ws_frame(envelopes(holder, "HELLO", "SYSTEM", downstream.HELLO)))
    while downstream.HELLO_REPLY not in buf:
        buf += sock.recv(65536)
    carry = b""
    make, answer = (tool_call, TOOL_DONE) if kind == "tool" else (ping, downstream.PONG)
    for _ in range(0 if kind == "ws" else batches):
        for _ in range(BATCH):  # one in flight: the next once this one is answered
            sock.sendall(make(holder))
            data = b""
            while answer not in data:
                data += sock.recv(65536)
    for _ in range(batches if kind == "ws" else 0):
        sock.sendall(b"".join(ping(holder) for _ in range(BATCH)))
        got = 0
        while got < BATCH:
            data = carry + sock.recv(262144)
            got += data.count(downstream.PONG)
            carry = data[-(len(downstream.PONG) - 1):]
    sock.close()


def http_session(port: int, token: str, transport: str, batches: int, idx: int) -> None:
    s = downstream.Session(idx, {"baseUrl": f"http://127.0.0.1:{port}", "token": token,
                                 "transport": transport})
    s.open()
    for i in range(batches):
        s.target = s.pongs + BATCH
        s.arrived.clear()
        s.post([s.envelope("PING", "SYSTEM", f'{{"nonce":"n{i}-{j}"}}') for j in range(BATCH)])
        while s.pongs < s.target:
            if not s.arrived.wait(300):
                raise ConnectionError("the PONGs did not come down")
            s.arrived.clear()
    s.close()


def worker_total(transport: str, batches: int, app: str, root: Path = ROOT,
                 sim: bool = False) -> dict[str, int]:
    """The gunicorn worker's callgrind events (``Ir``: instructions; with ``sim`` the
    cache and branch simulation's too) for one run of ``batches`` per session."""
    port = free_port()
    out = tempfile.mkdtemp(prefix="protoflask-worker-cg-")
    env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
           "ENABLE_COMPRESSION": "false", "ECHO_MESSAGES": "false", "RATE_LIMIT": "0",
           "MAX_CONNECTIONS": "1000", "MAX_CONNECTIONS_PER_USER": "1000",
           "WEB_CONCURRENCY": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    env.pop("REDIS_URL", None)
    if sim:
        env["VALGRIND_OPTS"] = "--cache-sim=yes --branch-sim=yes"
    proc = gunicorn_under_callgrind(root, port, env, out, app)
    now = int(time.time())
    token = jwt.encode({"sub": "bench", "iat": now, "exp": now + 86400}, SECRET,
                       algorithm="HS256")
    if transport in ("ws", "tool", "ping"):
        runs = [gevent.spawn(ws_session, port, token, batches, transport)
                for _ in range(SESSIONS)]
    else:
        runs = [gevent.spawn(http_session, port, token, transport, batches, i)
                for i in range(SESSIONS)]
    try:
        gevent.joinall(runs, raise_error=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(300)
    # the worker: the master and the tools it ran do far less
    return max(events(f"{out}/cg.*"), key=lambda e: e["Ir"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("transport", choices=["ws", "sse", "stream", "tool", "ping"])
    p.add_argument("--k1", type=int, default=2)
    p.add_argument("--k2", type=int, default=6)
    p.add_argument("--app", default="wsgi:app")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server runs")
    p.add_argument("--sim", action="store_true", help="cache and branch simulation too")
    args = p.parse_args()
    root = args.root.resolve()
    first = worker_total(args.transport, args.k1, args.app, root, args.sim)
    second = worker_total(args.transport, args.k2, args.app, root, args.sim)
    messages = (args.k2 - args.k1) * SESSIONS * BATCH
    per = (second["Ir"] - first["Ir"]) / messages
    print(f"{args.transport} ({root}): {per:,.0f} instructions per message in the worker "
          f"({first['Ir']:,} with {args.k1} batches per session, {second['Ir']:,} with "
          f"{args.k2})")
    if args.sim:
        print("  per message: " + ", ".join(
            f"{name} {(second[name] - first[name]) / messages:,.0f}" for name in first))


if __name__ == "__main__":
    main()
