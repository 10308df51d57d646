"""A client's text open when its session moves to another node (a resume there, or its
node draining on SIGTERM) ends on the new node whole: the old node accepted its START
and first PARTs (their seqs are seen, the client does not send them again), so they move
with the session's state; the echo of the USER text carries all of it, exactly once."""

from __future__ import annotations

from typing import Callable

import pytest

from protoflask import ProtoServer

from ..support import BaseClient, SSEClient, StreamClient, WSClient, wait_for
from .retry import when_served


@pytest.mark.parametrize("move", ["resume", "drain"])
@pytest.mark.parametrize("kind", [WSClient, SSEClient, StreamClient],
                         ids=["ws", "sse", "stream"])
def test_a_text_open_when_its_session_moves_ends_whole_on_the_new_node(
        make_node: Callable[..., ProtoServer], move: str,
        kind: Callable[..., BaseClient]) -> None:
    a, b = make_node(echoMessages=True), make_node(echoMessages=True)
    token = a.issue_token("alice")
    client = kind(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        client.send("MESSAGE_START", payload={"message_id": "t1",
                                              "content_type": "text/plain"})
        client.send("MESSAGE_PART", payload={"message_id": "t1", "content": "first, "})
        client.send("MESSAGE_PART", payload={"message_id": "t1", "content": "second, "})
        client.send("PING", "SYSTEM", {"nonce": "handled"})  # a handled all before it
        client.recv_type("PONG", nonce="handled")
        seen = int(client.received[-1]["seq"])
        if move == "drain":
            a.stop()  # hands its sessions over to the cluster
        else:
            client.drop()
            wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
        resumed = when_served(lambda: kind(b.base_url, token, session=sid,
                                           last_seq=seen))
        resumed.envelopes = client.envelopes  # the client's upstream seqs go on
        try:
            resumed.send("MESSAGE_PART", payload={"message_id": "t1", "content": "third"})
            resumed.send("MESSAGE_END", payload={"message_id": "t1"})
            resumed.recv_type("MESSAGE_END")
            parts = [m["payload"]["content"] for m in resumed.received
                     if m["type"] == "MESSAGE_PART"]
            assert "".join(parts) == "first, second, third"
            assert not [m for m in resumed.received if m["type"] == "ERROR"], \
                resumed.received
            assert b.hub.get(sid) is not None
        finally:
            resumed.close()
    finally:
        client.close()
