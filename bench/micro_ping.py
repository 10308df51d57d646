"""In-process PING -> PONG cost, without sockets or a load generator (repeatable to a
few percent where bench/run.py moves by +-30%).

    python bench/micro_ping.py [--n 20000] [--repeat 5] [--redis URL]

One WebSocketConnection of the real engine (in memory, or on Redis with ``--redis``) is
fed masked PING frames one per ``recv`` (what a closed-loop client at 100 connections
mostly produces) by a fake socket that swallows what is sent; beside it, the bare
sans-I/O echo loop of bench/servers/gevent_sansio_echo.py on the same frames. Prints the
CPU microseconds per message of each (best of ``--repeat``) and their ratio. Not the
syscalls, the hub or the GC of a long-running worker: bench/run.py measures those.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
from websockets.frames import Frame, Opcode  # noqa: E402
from websockets.protocol import State  # noqa: E402
from websockets.server import ServerProtocol  # noqa: E402


class FakeSocket:
    """Hands out ``chunks`` one per ``recv`` and swallows what is sent. A closed loop: the
    next chunk (or the end) only once each chunk so far was answered by a write (at once
    in memory; on Redis the write waits for the journal, so the read waits for it)."""

    def __init__(self, chunks: list[bytes]) -> None:
        from gevent.event import Event

        self.chunks = chunks
        self.i = 0
        self.sent = 0
        self._answered = Event()

    def recv(self, _n: int) -> bytes:
        i = self.i
        while self.sent < i:
            self._answered.clear()
            self._answered.wait()
        if i >= len(self.chunks):
            return b""
        self.i = i + 1
        return self.chunks[i]

    def send(self, data: Any) -> int:
        self.sent += 1
        self._answered.set()
        return len(data)

    def shutdown(self, _how: int) -> None:
        pass


def frame(obj: dict[str, Any]) -> bytes:
    return Frame(Opcode.TEXT, orjson.dumps(obj)).serialize(mask=True, extensions=[])


def pings(session: str, first_seq: int, n: int) -> list[bytes]:
    now = str(int(time.time() * 1000))
    return [frame({"id": f"c-{seq}", "session": session, "seq": str(seq), "ts": now,
                   "type": "PING", "channel": "SYSTEM",
                   "payload": {"nonce": f"n-{seq:012d}-abcdefghijklmnop"}})
            for seq in range(first_seq, first_seq + n)]


def echo_once(chunks: list[bytes]) -> float:
    sock = FakeSocket(chunks)
    proto = ServerProtocol(state=State.OPEN, max_size=None)
    t0 = time.process_time()
    while proto.state is not State.CLOSED:
        data = sock.recv(65536)
        if data:
            proto.receive_data(data)
        else:
            proto.receive_eof()
        for event in proto.events_received():
            if event.opcode is Opcode.TEXT:
                proto.send_text(event.data)
        out = proto.data_to_send()
        if out:
            sock.send(b"".join(out))
        if not data:
            break
    return time.process_time() - t0


def make_server(redis: str | None) -> Any:
    from protoflask import ProtoServer

    config: dict[str, Any] = {
        "jwtSecret": "micro-bench-secret-that-is-long-enough!", "enableLogging": False,
        "enableCompression": False, "echoMessages": False, "maxConnections": 11000,
        "rateLimit": 1e9,  # the bucket still runs; it never empties here
        # the fake clients never answer a server PING: under valgrind a run of many
        # connections lasts longer than the default 30 s, and its connections were closed
        "heartbeatInterval": 86_400_000}
    if redis:
        config["redisUrl"] = redis
        config["redisPrefix"] = f"protoflask-micro-{os.getpid()}"
    server = ProtoServer(config)
    # the GC policy of a serving worker (gunicorn's, the embedded server's): without it
    # every full collection here walks the whole start-up heap, which a worker froze, and
    # checkouts from before the policy moved out of the engine (which froze it there)
    # would be measured under another policy than this one
    from protoflask.serving import freeze_startup_heap

    freeze_startup_heap()
    return server


def time_read_loop(engine: Any, live: Any, sock: FakeSocket) -> float:
    """Serve ``sock``'s frames (the HELLO first) on a WebSocketConnection of ``live`` until
    they run out; the CPU seconds the read loop took (HELLO included: one in thousands)."""
    import gevent

    from protoflask.port import SessionPort
    from protoflask.transports.websocket import WebSocketConnection

    port = SessionPort(engine, live, None, WebSocketConnection.kind)
    conn = WebSocketConnection(port.limits, sock, compression=False)  # type: ignore[arg-type]
    conn.reader = gevent.getcurrent()
    conn.port = port
    port.attach(conn)
    conn.flush()
    t0 = time.process_time()
    conn._read_loop()
    spent = time.process_time() - t0
    port.end()
    return spent


def hello_frame(session_id: str) -> bytes:
    return frame({"id": "c-1", "session": session_id, "seq": "1", "ts": "1", "type": "HELLO",
                  "channel": "SYSTEM", "payload": {"proto_version": "1.1.2",
                                                   "accept_major": [1]}})


def protoflask_once(server: Any, n: int) -> float:
    engine = server.engine
    engine.ensure_running()
    live = engine.new_session("micro")
    sock = FakeSocket([hello_frame(live.id)] + pings(live.id, 2, n))
    spent = time_read_loop(engine, live, sock)
    assert sock.sent >= n, sock.sent
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--redis", default=None, help="a Redis URL: the cluster hub")
    ap.add_argument("--only", choices=("echo", "protoflask"), default=None,
                    help="run one side only (bench/instructions.py counts each under valgrind)")
    args = ap.parse_args()
    if args.only == "protoflask":
        protoflask_once(make_server(args.redis), args.n)
        return
    if args.only == "echo":
        echo_once(pings("s", 2, args.n))
        return
    server = make_server(args.redis)
    chunks = pings("s", 2, args.n)
    echo = min(echo_once(chunks) for _ in range(args.repeat)) / args.n * 1e6
    proto = min(protoflask_once(server, args.n) for _ in range(args.repeat)) / args.n * 1e6
    print(f"bare sans-I/O echo: {echo:.2f} us/msg")
    print(f"protoflask{' on Redis' if args.redis else ''}: {proto:.2f} us/msg "
          f"({proto / echo:.2f}x the echo)")


if __name__ == "__main__":
    main()
