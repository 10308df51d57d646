"""What a handshaken idle session keeps, counted: the GC-tracked objects each one adds
(its core, its parts, the live session, the port and its bell, its user's account),
which every young collection walks (docs/PERFORMANCE.md, "Fewer objects per session,
branch storm7obj"). Made as a WebSocket's session is (admission, port, attach, a HELLO
through the port, its reply taken), on the engine alone; bench/session_objects.py
prints the same count by type.

Measured at 16.1 a session (rate limit on) on the branch storm7obj (34.1 before it:
the parts made up front, 9 bound methods, the port's partial, two bells, the stage, an
empty resend queue), and at 12.1 on storm8obj, which set the bound (the outbound
queue's two empty pending lists shared, the heartbeat and the seen seqs the session's
bases); the bound leaves no room for one object more a session. Without a rate limit
the limiter is shared too (one fewer)."""

from __future__ import annotations

import gc
import time
from collections import Counter
from typing import Any

import gevent
import jwt
import orjson

from protoflask.auth import authority_from_config
from protoflask.clock import now_ms
from protoflask.config import ServerConfig
from protoflask.engine import Engine
from protoflask.hub import LocalHub
from protoflask.port import Ports
from protoflask.tools import ToolRegistry

SECRET = "test-secret-that-is-long-enough-for-hs256!"
#: tracked objects a handshaken idle session may keep (12.1 measured; 16.1 and 34.1
#: before)
BOUND = 12.5


class Writer:
    """A transport's connection as its port sees it (not counted: the test keeps it)."""

    __slots__ = ("reader", "wakes")

    def __init__(self) -> None:
        self.reader = None
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1

    def close(self, code: int, reason: str) -> None:
        pass


def _token(user: str) -> str:
    return jwt.encode({"sub": user, "exp": int(time.time()) + 3600}, SECRET,
                      algorithm="HS256")


def _handshake(ports: Ports, token: str, writers: list[Any], kept: list[Any]) -> None:
    admission = ports.admit(token, None, None, "websocket")
    port = ports.port(admission, "websocket")
    writer = Writer()
    port.attach(writer)
    port.receive(orjson.dumps({
        "id": "c-1", "session": port.id, "seq": "1", "ts": str(now_ms()), "type": "HELLO",
        "channel": "SYSTEM", "payload": {"proto_version": "1.1.2", "accept_major": [1]}}))
    (ready,) = port.take()
    assert b'"type":"HELLO"' in ready[1]
    writers.append(writer)
    kept.append(port)


def _kept(n: int, **settings: Any) -> tuple[float, Counter[str]]:
    config = ServerConfig.load({"jwtSecret": SECRET, "maxConnections": 10**6,
                                "maxConnectionsPerUser": 10**6, **settings}, environ={})
    engine = Engine(config, LocalHub(), ToolRegistry(), authority_from_config(config),
                    emit=lambda *a, **k: None, emit_error=lambda *a, **k: None)
    ports = Ports(engine)
    writers: list[Any] = []
    kept: list[Any] = []
    for i in range(20):  # first-use tables and caches
        _handshake(ports, _token(f"warm-{i}"), [], [])
    tokens = [_token(f"u{i}") for i in range(n)]  # a user each, as a storm's
    writers.extend(Writer() for _ in range(n))  # room made: the test's own objects
    writers.clear()
    gevent.sleep(0)
    gc.collect()
    before = Counter(type(o).__qualname__ for o in gc.get_objects())
    for token in tokens:
        _handshake(ports, token, writers, kept)
    gevent.sleep(0)  # the bells' rings answered, as a worker's loop does
    gc.collect()
    after = Counter(type(o).__qualname__ for o in gc.get_objects())
    grown = after - before
    grown["Writer"] -= n  # the test's stand-ins for the transports
    assert len(kept) == n and engine.hub.get(kept[-1].id) is not None
    return sum(grown.values()) / n, grown


def test_a_handshaken_idle_session_keeps_few_objects() -> None:
    per_session, by_type = _kept(300)
    assert per_session <= BOUND, (per_session, by_type.most_common(12))


def test_without_a_rate_limit_the_limiter_is_shared() -> None:
    per_session, by_type = _kept(300, rateLimit=0)
    assert per_session <= BOUND - 1 and by_type["RateLimiter"] == 0, by_type.most_common(12)


def test_an_idle_session_keeps_no_bound_method() -> None:
    """The session's parts and the port's bell hold functions and their objects; the
    port's ``receive`` is a method, not a partial of the engine's."""
    _, by_type = _kept(300)
    assert by_type["method"] == by_type["partial"] == 0, by_type.most_common(12)
