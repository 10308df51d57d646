"""The last tenth of the slots is kept for light users (issue 24), on a real server: under
the default maxConnectionsPerUser (a tenth of maxConnections) heavy users, each opening
WebSockets until refused, stop at their cap, and once no more than a tenth of the
slots is free a user who already holds a hundredth of maxConnections is refused
(503 USER_CONNECTION_LIMIT) below their cap, while users holding none still get in,
up to maxConnections. A slot a heavy user gives back goes to a light user, not back to
a heavy one. Without the reserve (tests/engine/test_user_caps.py holds the counting),
ten heavy users took every slot and the eleventh user got 503 MAX_CONNECTIONS.

maxConnections is 40 here: a heavy user's cap is 4, the reserve 4 slots, and "light"
means holding no connection yet (a hundredth of 40, at least 1)."""

from __future__ import annotations

import socket

import orjson
import pytest
import requests

from ..hardening_support import (
    Live, UPGRADE_HEADERS, connect, envelope, error_code, vitals, ws_frame, ws_hello,
)
from ..support import _host_port, timeout, wait_for

MAX = 40


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, maxConnections=MAX)
    try:
        yield server
    finally:
        server.stop()


def open_ws(base_url: str, token: str) -> socket.socket | str:
    """A WebSocket that said HELLO, or the error code it was refused with."""
    sock = connect(base_url)
    host, port = _host_port(base_url)
    sock.sendall((f"GET /proto/websocket?token={token} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                  + "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items())
                  + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        assert piece, data
        data += piece
    if data.startswith(b"HTTP/1.1 101"):
        ws_hello(sock)
        return sock
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += sock.recv(4096)
    sock.close()
    assert head.startswith(b"HTTP/1.1 503"), head
    return error_code(body) or ""


def take_all(base_url: str, token: str, held: list[socket.socket],
             most: int = 20) -> tuple[int, str]:
    """Open WebSockets for one user until refused: how many, and the refusal's code."""
    for n in range(most):
        got = open_ws(base_url, token)
        if isinstance(got, str):
            return n, got
        held.append(got)
    return most, ""


def test_heavy_users_leave_the_last_tenth_to_light_users(live):
    held: list[socket.socket] = []
    try:
        for user in range(9):  # nine heavy users at their cap: 36 of 40 slots
            assert take_all(live.base_url, live.token(f"heavy{user}"), held) == \
                (MAX // 10, "USER_CONNECTION_LIMIT")
        # a tenth: in as a light user, then refused below its cap (the reserve)
        assert take_all(live.base_url, live.token("heavy9"), held) == \
            (1, "USER_CONNECTION_LIMIT")
        # users holding nothing take the rest, then the worker is full
        for user in range(3):
            assert take_all(live.base_url, live.token(f"light{user}"), held, most=1) == (1, "")
        assert open_ws(live.base_url, live.token("light-late")) == "MAX_CONNECTIONS"
        assert requests.get(live.base_url + "/health", timeout=timeout(10)).status_code == 200
        assert vitals(live.base_url)["activeConnections"] == MAX
        # a heavy user gives a slot back: a light user gets it, the heavy one does not
        held.pop(0).close()
        wait_for(lambda: vitals(live.base_url)["activeConnections"] == MAX - 1,
                 what="the slot back")
        assert open_ws(live.base_url, live.token("heavy0")) == "USER_CONNECTION_LIMIT"
        got = open_ws(live.base_url, live.token("light-late"))
        assert not isinstance(got, str), got
        held.append(got)
        # every connection held still answers: a PING on the light user's
        got.sendall(ws_frame(orjson.dumps(envelope("PING", payload={"nonce": "light"},
                                                   seq=2))))
        got.settimeout(timeout(10))
        seen = b""
        while b'"nonce":"light"' not in seen:
            piece = got.recv(65536)
            assert piece, seen
            seen += piece
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="all closed")
