"""The upgrade's answer from a template (issue 29): ``accept_fast`` either leaves the
request to websockets (None) or writes exactly what websockets' ``accept_plain`` writes,
Date line aside (it is this second's in both)."""

from __future__ import annotations

import re

import pytest

from protoflask.transports.ws_handshake import accept_fast, accept_plain

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def environ(**headers: str) -> dict[str, str]:
    base = {"HTTP_HOST": "127.0.0.1:80", "HTTP_UPGRADE": "websocket",
            "HTTP_CONNECTION": "Upgrade", "HTTP_SEC_WEBSOCKET_KEY": KEY,
            "HTTP_SEC_WEBSOCKET_VERSION": "13", "PATH_INFO": "/proto/websocket",
            "QUERY_STRING": "token=t"}
    for k, v in headers.items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    return base


CASES = [
    environ(),
    environ(HTTP_CONNECTION="keep-alive, Upgrade"),  # Firefox
    environ(HTTP_CONNECTION="upgrade"),
    environ(HTTP_UPGRADE="WebSocket"),
    environ(HTTP_ORIGIN="https://example.com"),
    environ(HTTP_SEC_WEBSOCKET_EXTENSIONS="permessage-deflate; client_max_window_bits"),
    environ(HTTP_SEC_WEBSOCKET_PROTOCOL="chat"),
    environ(HTTP_SEC_WEBSOCKET_KEY="x3JJHMbDL1EzLkh9GBhXDw=="),
    environ(HTTP_CONNECTION="keep-alive"),  # refusals: websockets answers them
    environ(HTTP_CONNECTION="Upgrade, bad token"),
    environ(HTTP_CONNECTION=""),
    environ(HTTP_CONNECTION=None),
    environ(HTTP_UPGRADE="h2c"),
    environ(HTTP_UPGRADE="websocket, h2c"),
    environ(HTTP_UPGRADE=None),
    environ(HTTP_SEC_WEBSOCKET_KEY="short"),
    environ(HTTP_SEC_WEBSOCKET_KEY="not base64 at all!!!!!!!"),
    environ(HTTP_SEC_WEBSOCKET_KEY="AAAAAAAAAAAAAAAAAAAAAAAAAAAA"),  # 21 bytes
    environ(HTTP_SEC_WEBSOCKET_KEY="ÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿ"),
    environ(HTTP_SEC_WEBSOCKET_KEY=None),
    environ(HTTP_SEC_WEBSOCKET_VERSION="8"),
    environ(HTTP_SEC_WEBSOCKET_VERSION=None),
]


def undated(chunks: list[bytes]) -> list[bytes]:
    return [re.sub(rb"Date: [^\r]*\r\n", b"Date: -\r\n", c) for c in chunks]


@pytest.mark.parametrize("compression", [False, True])
@pytest.mark.parametrize("env", CASES)
def test_the_template_defers_or_writes_what_websockets_writes(env: dict[str, str],
                                                               compression: bool) -> None:
    fast = accept_fast(env, compression)
    if fast is None:
        return
    plain = accept_plain(env, compression)
    assert undated(fast[0]) == undated(plain[0])
    assert fast[1:] == plain[1:]
    assert b"Date: " in fast[0][0]


def test_the_common_upgrades_take_the_template() -> None:
    for env in CASES[:8]:
        assert accept_fast(env, False) is not None, env
        assert accept_fast(env, True) is None  # compression: websockets negotiates it


CONNECTIONS = ["Upgrade", "upgrade", "UPGRADE", "keep-alive, Upgrade", "Upgrade, keep-alive",
               "keep-alive", "", " ", ",", "Upgrade,", ", upgrade", "Upgrade, bad token",
               "up grade", "\tUpgrade\t", " upgrade ", "keep-alive,\tupgrade", "Upgrade;q=1",
               "upgrade\x0b", "Upgrade, Upgrade", "xupgrade", "ÿ"]


def test_the_connection_verdicts_remembered_are_the_ones_worked_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap point ``ws_handshake.REMEMBER_CONNECTION``: each Connection value's two
    verdicts the same remembered (asked twice: worked out, then remembered) as worked
    out every time; the memories bounded."""
    from protoflask.transports import ws_handshake as wh

    def verdicts() -> list[tuple[bool, bool]]:
        return [(wh.upgrade_listed(c), wh.asks_upgrade(c)) for c in CONNECTIONS]

    monkeypatch.setattr(wh, "REMEMBER_CONNECTION", False)
    plain = verdicts()
    monkeypatch.setattr(wh, "REMEMBER_CONNECTION", True)
    monkeypatch.setattr(wh, "_upgrade_listed", {})
    monkeypatch.setattr(wh, "_asks_upgrade", {})
    assert verdicts() == plain and verdicts() == plain
    assert wh._upgrade_listed and wh._asks_upgrade
    assert plain[0] == (True, True) and plain[5] == (False, False)
    assert plain[11] == (False, True)  # websockets refuses the token list, werkzeug not
    for i in range(200):
        wh.upgrade_listed(f"x{i}")
        wh.asks_upgrade(f"x{i}")
    assert len(wh._upgrade_listed) <= wh._CONNECTION_MAX
    assert len(wh._asks_upgrade) <= wh._CONNECTION_MAX
