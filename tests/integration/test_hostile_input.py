"""Hostile input on every transport: each bad message gets its contract error and the
session keeps answering; nothing crashes or leaks a connection."""

from __future__ import annotations

import pytest

from ..support import wait_for

HOSTILE = [
    "[" * 5000 + "]" * 5000,                    # nesting deeper than any parser should go
    '{"id": "x", "seq": "1", "n": 1' + "0" * 400 + "}",  # a number no machine int holds
    '{"id": 1e999}',                            # infinity
    "\ufeff{}",                                 # BOM, then an empty object
    '"just a string"',
    "null",
    '{"id": "a", "session": "", "seq": "2", "ts": "1", "type": "PING", "channel": "SYSTEM", '
    '"payload": {"nonce": {"deep": [1, 2, {"x": null}]}}}',
    '{"id": "\\ud800", "session": "", "seq": "3", "ts": "1", "type": "PING", '
    '"channel": "SYSTEM", "payload": {"nonce": "n"}}',
]


@pytest.mark.parametrize("frame", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_frame_gets_an_error_and_the_session_lives(server, token, make_client, frame):
    client = make_client(server, token)
    client.hello()
    client.send_raw(frame)
    err = client.recv_type("ERROR")
    assert err["payload"]["code"] in ("INVALID_MESSAGE", "UNSUPPORTED_TYPE")
    client.send("PING", "SYSTEM", {"nonce": "alive"}, seq=str(2**53 - 1))  # the largest seq
    client.recv_type("PONG", nonce="alive")
    client.close()
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="connection released")
