"""The GC-tracked objects one handshaken idle session keeps, in process (issue 29).

    python bench/session_objects.py [--n 2000] [--top 40]

An ``Engine`` on a ``LocalHub`` (the server's own, without sockets), then ``--n``
sessions each made as a WebSocket's is (``Ports.admit``/``port``, ``SessionPort.attach``
with a writer standing for the transport's connection), sent a HELLO through the port and
its reply taken for the wire. Prints the objects ``gc.get_objects()`` holds more after
them than before, per session, by type: what a worker's young collections walk for every
idle session (bench/idle_anatomy.py counts the same in a real worker, the transport's
socket, greenlets and watchers too). The transport's own objects are not here.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gevent  # noqa: E402
import orjson  # noqa: E402

import jwt  # noqa: E402

from protoflask.auth import authority_from_config  # noqa: E402
from protoflask.clock import now_ms  # noqa: E402
from protoflask.config import ServerConfig  # noqa: E402
from protoflask.engine import Engine  # noqa: E402
from protoflask.hub import LocalHub  # noqa: E402
from protoflask.port import Ports, SessionPort  # noqa: E402
from protoflask.tools import ToolRegistry  # noqa: E402

SECRET = "bench-secret-that-is-long-enough-for-hs256!"


class Writer:
    """What a transport's connection gives its port: ``wake`` and its reader greenlet."""

    __slots__ = ("reader", "wakes")

    def __init__(self) -> None:
        self.reader = None
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1

    def close(self, code: int, reason: str) -> None:
        pass


def token(user: str) -> str:
    return jwt.encode({"sub": user, "exp": int(time.time()) + 3600}, SECRET, algorithm="HS256")


def engine() -> tuple[Engine, Ports]:
    config = ServerConfig.load({"jwtSecret": SECRET, "maxConnections": 10**6,
                                "maxConnectionsPerUser": 10**6, "rateLimit": 0},
                               environ={})
    eng = Engine(config, LocalHub(), ToolRegistry(), authority_from_config(config),
                 emit=lambda *a, **k: None, emit_error=lambda *a, **k: None)
    return eng, Ports(eng)


def handshake(ports: Ports, jwt_token: str, keep: list[Any]) -> SessionPort:
    """One session made and greeted as a WebSocket's; ``keep`` holds what its transport
    would (the port and the writer)."""
    admission = ports.admit(jwt_token, None, None, "websocket")
    port = ports.port(admission, "websocket")
    writer = Writer()
    port.attach(writer)
    port.receive(orjson.dumps({
        "id": "c-1", "session": port.id, "seq": "1", "ts": str(now_ms()), "type": "HELLO",
        "channel": "SYSTEM", "payload": {"proto_version": "1.1.2", "accept_major": [1]}}))
    port.take()
    keep.append((port, writer))
    return port


def census() -> Counter[str]:
    gc.collect()
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def per_session(n: int) -> tuple[float, list[tuple[str, float]]]:
    """Tracked objects kept per handshaken session: the total, and by type."""
    eng, ports = engine()
    keep: list[Any] = []
    for i in range(20):  # warm: caches, templates, first-use tables
        handshake(ports, token(f"warm-{i}"), [])
    tokens = [token(f"u{i}") for i in range(n)]  # a user each, as bench/storm.py's
    before = census()
    for t in tokens:
        handshake(ports, t, keep)
    gevent.sleep(0)  # the bells' rings answered (the writers' wakes), as a worker's loop does
    after = census()
    rows = [(name, (after[name] - before[name]) / n) for name in after
            if after[name] - before[name] >= n // 2]
    rows.sort(key=lambda r: (-r[1], r[0]))
    total = (sum(after.values()) - sum(before.values())) / n
    del keep, eng
    return total, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    total, rows = per_session(args.n)
    print(f"{total:.2f} GC-tracked objects per handshaken session ({args.n} sessions)")
    for name, count in rows[:args.top]:
        print(f"  {count:6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
