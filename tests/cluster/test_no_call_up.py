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
