"""A session that moves to another node stops counting against its user's memory budget
on the old node at once (issue 24): the old node gives its charge back when it lets the
session go, not at its next heartbeat tick. Before, the user stayed charged there for up
to a tick (a second) for what the new node now holds: their texts, calls and window
counted twice, and a user near maxUserBytes was refused on the old node meanwhile."""

from __future__ import annotations

from typing import Callable

from protoflask import ProtoServer

from ..support import WSClient, wait_for
from .retry import when_served


def held(node: ProtoServer, user: str) -> int:
    account = node.engine.budget.accounts.get(user)
    return 0 if account is None else account.held + account.window


def test_a_session_that_moved_is_no_longer_charged_on_the_old_node(
        make_node: Callable[..., ProtoServer]) -> None:
    a, b = make_node(echoMessages=True), make_node(echoMessages=True)
    # the tick's recount off on a: only the hand-over can give the charge back there
    a.engine.budget.review = lambda sessions: None  # type: ignore[method-assign]
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        client.send("MESSAGE_START", payload={"message_id": "t1",
                                              "content_type": "text/plain"})
        client.send("MESSAGE_PART", payload={"message_id": "t1", "content": "x" * 200_000})
        client.send("PING", "SYSTEM", {"nonce": "handled"})
        client.recv_type("PONG", nonce="handled")
        assert held(a, "alice") > 200_000  # the open text, as a holds it
        seen = int(client.received[-1]["seq"])
        client.drop()
        wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
        resumed = when_served(lambda: WSClient(b.base_url, token, session=sid,
                                               last_seq=seen))
        resumed.envelopes = client.envelopes
        try:
            assert b.hub.get(sid) is not None and a.hub.get(sid) is None
            assert held(a, "alice") == 0
            assert held(b, "alice") > 200_000  # the open text moved, charged on b
            resumed.send("MESSAGE_END", payload={"message_id": "t1"})
            resumed.recv_type("MESSAGE_END")
        finally:
            resumed.close()
    finally:
        client.close()
