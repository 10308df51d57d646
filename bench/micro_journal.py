"""Instructions per PING -> PONG that the Redis journal adds when a batch holds many
sessions, counted the same way every run.

    python bench/micro_journal.py [--connections 100] [--n1 10] [--n2 40] [--redis URL]

Runs ``--connections`` WebSocketConnections of the real engine (the same fake sockets as
bench/micro_ping.py) in one greenlet, round after round: each connection reads one PING
and flushes its PONG (on Redis: hands it to the journal), then the journal commits the
round as one batch, whose EVALSHA a stand-in connection answers at once ("nothing
fenced"). No network and no event loop, so none of the timing that makes
bench/instructions.py's Redis count move by 10% between runs (how the loop's turns meet
Redis's replies): what is left is the Python work per reply, the journal's included
(the hand-off, the append, the state line, packing the command, the continuation), and
the per-batch work divided by the batch. Under ``valgrind --tool=callgrind`` with n1 and
with n2 rounds, both in memory and on Redis; prints the full counts (no
``--toggle-collect``) per reply and the difference. Needs valgrind and Redis.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class SwallowingSocket:
    """What a connection writes goes nowhere; reading is the bench's own (no recv)."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, data: Any) -> int:
        self.sent += 1
        return len(data)

    def shutdown(self, _how: int) -> None:
        pass


class AnsweringConnection:
    """The journal's own Redis connection, answering every EVALSHA "nothing fenced"."""

    def execute_packed(self, _command: bytes) -> list[int]:
        return []


def rounds(redis: str | None, connections: int, n: int) -> None:
    import gevent

    from micro_ping import frame, make_server, pings
    from protoflask.port import SessionPort
    from protoflask.transports.websocket import WebSocketConnection

    engine = make_server(redis).engine
    engine.ensure_running()
    journal = getattr(engine.hub, "journal", None)
    conns = []
    for _ in range(connections):
        live = engine.new_session("micro")
        sock = SwallowingSocket()
        port = SessionPort(engine, live, None, WebSocketConnection.kind)
        conn = WebSocketConnection(port.limits, sock, compression=False)  # type: ignore[arg-type]
        conn.port = port
        conn.reader = gevent.getcurrent()
        port.attach(conn)
        conn.flush()
        conn._read_frames(frame({"id": "c-1", "session": live.id, "seq": "1", "ts": "1",
                                 "type": "HELLO", "channel": "SYSTEM",
                                 "payload": {"proto_version": "1.1.2", "accept_major": [1]}}))
        conn.flush()
        conns.append((conn, sock, live.id))
    if journal is not None:
        journal.flush()
        journal._conn, journal._conn_pid = AnsweringConnection(), os.getpid()
    for i in range(n):
        # each PING made here, not before: nothing yields in this loop, so the hub's
        # beat and listener (which run whenever the setup waits for Redis) cannot take
        # turns in proportion to n (a setup that made n frames took time in proportion)
        for conn, _, session_id in conns:
            conn._read_frames(pings(session_id, 2 + i, 1)[0])
            conn.flush()
        if journal is not None:
            journal.flush()
    for _, sock, _ in conns:
        assert sock.sent >= n, sock.sent


def total(redis: str | None, connections: int, n: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
           __file__, "--inner", str(n), "--connections", str(connections),
           "--redis", redis or ""]  # "": in memory
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None or done.returncode:
        raise SystemExit(f"{n} rounds failed under callgrind:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--n1", type=int, default=10)
    ap.add_argument("--n2", type=int, default=40)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--inner", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner is not None:
        rounds(args.redis or None, args.connections, args.inner)
        return
    per = {}
    for label, redis in (("in memory", None), ("on Redis", args.redis)):
        per[label] = (total(redis, args.connections, args.n2)
                      - total(redis, args.connections, args.n1)) \
            / ((args.n2 - args.n1) * args.connections)
        print(f"{label}: {per[label]:,.0f} instructions per reply")
    print(f"Redis adds {per['on Redis'] - per['in memory']:,.0f} per reply "
          f"({args.connections} sessions per batch)")


if __name__ == "__main__":
    main()
