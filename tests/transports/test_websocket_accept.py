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
