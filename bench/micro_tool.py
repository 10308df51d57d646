"""In-process TOOL_CALL (built-in echo) -> TOOL_DONE cost, without sockets or a load
generator (repeatable to a few percent where bench/run.py's tool cell moves by +-20%).

    python bench/micro_tool.py [--n 20000] [--repeat 5] [--redis URL] [--pooled] [--profile]

One WebSocketConnection of the real engine (in memory, or on Redis with ``--redis``) is
fed masked TOOL_CALL frames for the built-in ``echo`` tool one per ``recv`` (what a
closed-loop client at 10 connections produces: one call in flight, answered before the
next arrives) by a fake socket that swallows what is sent. Prints the CPU microseconds per
call (best of ``--repeat``); pin it to one core (``taskset -c 1``). Beside it, the same
connection fed PING frames: the part of the cost that is the shared receive and write
path. ``--profile`` prints a cProfile of one run instead. Not the syscalls, the hub or the
GC of a long-running worker: bench/run.py --only tool measures those. ``--pooled`` calls
a copy of echo that is not inline (an application's tool: its own greenlet under the
tool timeout), the socket yielding to the hub before each read as a real one does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from micro_ping import (  # noqa: E402
    FakeSocket, frame, hello_frame, make_server, pings, time_read_loop,
)


def tool_calls(session: str, first_seq: int, n: int, tool: str = "echo") -> list[bytes]:
    now = str(int(time.time() * 1000))
    return [frame({"id": f"c-{seq}", "session": session, "seq": str(seq), "ts": now,
                   "type": "TOOL_CALL", "channel": "USER",
                   "payload": {"call_id": f"t0-{seq}", "tool": tool,
                               "params": {"message": "hello from the bench"}}})
            for seq in range(first_seq, first_seq + n)]


def run_once(server: Any, n: int, kind: str,
             socket: type[FakeSocket] = FakeSocket) -> tuple[float, FakeSocket]:
    engine = server.engine
    engine.ensure_running()
    live = engine.new_session("micro")
    hello = hello_frame(live.id)
    if kind == "ping":
        body = pings(live.id, 2, n)
    else:
        body = tool_calls(live.id, 2, n, "echo" if kind == "tool" else POOLED)
        body.append(pings(live.id, n + 2, 1)[0])  # the last pooled call ends before the EOF
    sock = socket([hello] + body)
    spent = time_read_loop(engine, live, sock)
    assert sock.sent >= n, sock.sent
    return spent, sock


POOLED = "echo_pooled"


def add_pooled_echo(server: Any) -> None:
    """The built-in echo as an application's tool: not inline."""
    from protoflask import Tool

    echo = server.engine.tools.get("echo")
    server.register_tool(Tool(POOLED, echo.description, echo.input_schema, echo.output_schema,
                              echo.execute))


class YieldingSocket(FakeSocket):
    """Lets the hub run (the pooled call's greenlet) before each read, as a socket
    that waits for the next message does."""

    def recv(self, n: int) -> bytes:
        import gevent

        gevent.sleep(0)
        return super().recv(n)


class CountingSocket(FakeSocket):
    """Keeps what is sent, to check that every call got its TOOL_DONE OK."""

    def __init__(self, chunks: list[bytes]) -> None:
        super().__init__(chunks)
        self.out: list[bytes] = []

    def send(self, data: Any) -> int:
        self.out.append(bytes(data))
        return super().send(data)


class CountingYieldingSocket(YieldingSocket, CountingSocket):
    pass


def check(server: Any, n: int, kind: str) -> None:
    socket = CountingYieldingSocket if kind == "pooled" else CountingSocket
    _, sock = run_once(server, n, kind, socket)
    assert isinstance(sock, CountingSocket)
    wire = b"".join(sock.out)
    done = wire.count(b'"type":"TOOL_DONE"')
    ok = wire.count(b'"status":"OK"')
    echoed = wire.count(b'"echoed":"hello from the bench"')
    assert done == ok == echoed == n, (done, ok, echoed, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--redis", default=None, help="a Redis URL: the cluster hub")
    ap.add_argument("--pooled", action="store_true", help="echo as a tool that is not inline")
    ap.add_argument("--profile", action="store_true", help="cProfile one run of the calls")
    args = ap.parse_args()
    server = make_server(args.redis)
    kind = "pooled" if args.pooled else "tool"
    socket = YieldingSocket if args.pooled else FakeSocket
    if args.pooled:
        add_pooled_echo(server)
    check(server, 200, kind)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run_once(server, args.n, kind, socket)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    ping = min(run_once(server, args.n, "ping", socket)[0]
               for _ in range(args.repeat)) / args.n * 1e6
    tool = min(run_once(server, args.n, kind, socket)[0]
               for _ in range(args.repeat)) / args.n * 1e6
    where = " on Redis" if args.redis else ""
    name = POOLED if args.pooled else "echo"
    print(f"protoflask{where} PING -> PONG: {ping:.2f} us/msg")
    print(f"protoflask{where} TOOL_CALL {name} -> TOOL_DONE: {tool:.2f} us/call "
          f"({tool - ping:+.2f} us over the PING)")


if __name__ == "__main__":
    main()
