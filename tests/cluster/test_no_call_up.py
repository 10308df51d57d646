"""A node that lost a session to another (its journal write fenced off) closes the
session's transport (4004) in a greenlet of its own, not on the cluster's stack: no call
back up from cluster/routing.py into the session layer (docs/ARCHITECTURE.md, "Calls
back up, counted"). Fails on the call it replaced (the close ran inside ``lost``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from gevent import getcurrent

from protoflask import ProtoServer
from protoflask.core.errors import CloseCode
from protoflask.core.messages import Outbound
from protoflask.live import Send

from ..support import WSClient, wait_for


def test_a_session_lost_to_another_node_is_closed_apart(
        make_node: Callable[..., ProtoServer]) -> None:
    a = make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        sid = client.session_id
        closes: list[tuple[int, Any]] = []
        host = a.hub.host

        def close_transport(live: Any, code: int, reason: str) -> None:
            closes.append((code, getcurrent()))
            host.close_transport(live, code, reason)

        a.hub.bind(dataclasses.replace(host, close_transport=close_transport))

        def lose() -> tuple[Any, list[tuple[int, Any]]]:
            a.hub.lost([sid])  # as the journal's fencing calls it
            return getcurrent(), list(closes)

        caller, at_return = a._call(lose)
        assert at_return == []  # not closed on the cluster's stack
        wait_for(lambda: client.close_code == 4004 or not client.is_open(),
                 what="the client let go")
        assert client.close_code == CloseCode.MOVED
        ((code, where),) = closes
        assert code == CloseCode.MOVED and where is not caller
    finally:
        client.close()


def test_nothing_stamped_after_the_session_was_lost_is_written(
        make_node: Callable[..., ProtoServer]) -> None:
    """Between ``lost`` and the close it sends apart, the writer may still take: what the
    session stamps then is not journaled here, and the node holding it now gives those
    seqs to its own messages, so it must not reach the client (the 4004 close does, and
    the client resumes there). Fails when a moved session's take writes (it did while
    the close ran on the cluster's stack, which left no window)."""
    a = make_node()
    client = WSClient(a.base_url, a.issue_token("bob"))
    try:
        client.hello()
        sid = client.session_id
        live = a.hub.get(sid)

        def lose_then_send() -> None:
            a.hub.lost([sid])  # as the journal's fencing calls it; the close goes apart
            live.run(Send(Outbound("PONG", "SYSTEM", {"nonce": "after-lost"})))
            live.notify()  # the writer's bell: it takes before the close runs

        a._call(lose_then_send)
        wait_for(lambda: not client.is_open(), what="the client let go")
        assert client.close_code == CloseCode.MOVED
        assert not [m for m in client.received
                    if m.get("payload", {}).get("nonce") == "after-lost"]
    finally:
        client.close()
