"""In-process PING -> PONG cost with many connections at once: what the Redis journal's
group commit costs per reply when a batch holds many sessions.

    python bench/micro_ping_many.py [--connections 100] [--n 200] [--repeat 5] [--redis URL]

Like bench/micro_ping.py (the real engine and WebSocketConnection, fake sockets that
swallow what is sent), but ``--connections`` readers run side by side, each in its own
greenlet, and each fake ``recv`` yields to the gevent loop first (``gevent.sleep(0)``):
every reader handles one PING per loop turn, as a closed-loop client at that many
connections makes them, so the journal commits one batch of up to ``--connections``
sessions per turn. Prints the CPU microseconds per reply (best of ``--repeat``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gevent  # noqa: E402

from micro_ping import FakeSocket, frame, make_server, pings  # noqa: E402


class YieldingSocket(FakeSocket):
    def recv(self, n: int) -> bytes:
        gevent.sleep(0)
        return super().recv(n)


def run_once(server: Any, connections: int, n: int) -> float:
    from protoflask.port import SessionPort
    from protoflask.transports.websocket import WebSocketConnection

    engine = server.engine
    engine.ensure_running()
    conns = []
    for _ in range(connections):
        live = engine.new_session("micro")
        hello = frame({"id": "c-1", "session": live.id, "seq": "1", "ts": "1",
                       "type": "HELLO", "channel": "SYSTEM",
                       "payload": {"proto_version": "1.1.2", "accept_major": [1]}})
        sock = YieldingSocket([hello] + pings(live.id, 2, n))
        port = SessionPort(engine, live, None, WebSocketConnection.kind)
        conn = WebSocketConnection(port.limits, sock, compression=False)  # type: ignore[arg-type]
        conn.port = port
        conn.reader = gevent.getcurrent()
        port.attach(conn)
        conn.flush()
        conn._read_frames(hello)  # the HELLO, outside the timing
        conn.flush()
        sock.i = 1
        conns.append((live, conn, sock))

    def read(conn: Any) -> None:
        conn.reader = gevent.getcurrent()
        conn._read_loop()

    journal = getattr(engine.hub, "journal", None)
    batches = [0]
    if journal is not None:  # count the group commits (an instance attribute: this run only)
        write = journal._write

        def counted(batch: Any) -> None:
            batches[0] += 1
            write(batch)
        journal._write = counted
    t0 = time.process_time()
    gevent.joinall([gevent.spawn(read, conn) for _, conn, _ in conns], raise_error=True)
    spent = time.process_time() - t0
    if journal is not None:
        del journal._write
        print(f"  {connections * n / batches[0]:.1f} replies per journal batch", file=sys.stderr)
    for _, conn, sock in conns:
        conn.port.end()
        assert sock.sent >= n, sock.sent
    return spent / (connections * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--redis", default=None, help="a Redis URL: the cluster hub")
    args = ap.parse_args()
    server = make_server(args.redis)
    best = min(run_once(server, args.connections, args.n) for _ in range(args.repeat)) * 1e6
    print(f"protoflask{' on Redis' if args.redis else ''}, {args.connections} connections: "
          f"{best:.2f} us/reply")


if __name__ == "__main__":
    main()
