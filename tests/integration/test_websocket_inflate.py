"""Compressed frames that inflate big (issue 24): a real client with permessage-deflate
sends a PING whose nonce deflates to about a kilobyte. Over maxMessageSize it is refused
while inflating (websockets' max_size on the deflate decoder: MESSAGE_TOO_LARGE, then
1009); under it, a nonce past MAX_NONCE_LENGTH is refused (INVALID_MESSAGE) instead of
being encoded and compressed again into a megabyte PONG, and the session goes on."""

from __future__ import annotations

import zlib

import pytest
from websockets.exceptions import ConnectionClosed

from protoflask.core.wire import MAX_NONCE_LENGTH

from ..support import WSClient


def deflated_size(text: str) -> int:
    return len(zlib.compress(text.encode(), 9))


def test_a_big_nonce_under_the_size_limit_is_refused_not_echoed(server, token):
    nonce = "a" * 1_000_000  # under maxMessageSize (1 MiB) with its envelope
    assert deflated_size(nonce) < 2_000
    with WSClient(server.base_url, token) as client:  # compression: deflate
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": nonce})
        error = client.expect_error("INVALID_MESSAGE")
        assert "PING" in error["payload"]["message"]
        assert not any(m["type"] == "PONG" for m in client.received)
        client.send("PING", "SYSTEM", {"nonce": "n" * MAX_NONCE_LENGTH})  # the longest
        client.recv_type("PONG", nonce="n" * MAX_NONCE_LENGTH)


def test_a_nonce_that_inflates_past_the_limit_is_refused_while_inflating(server, token):
    nonce = "a" * 2_000_000
    assert deflated_size(nonce) < 4_000
    with WSClient(server.base_url, token) as client:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": nonce})
        client.expect_error("MESSAGE_TOO_LARGE")
        with pytest.raises(ConnectionClosed):  # then the 1009 close
            while True:
                client.ws.recv(timeout=5)
        assert client.close_code == 1009
