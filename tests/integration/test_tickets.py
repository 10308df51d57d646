"""Connect tickets (issue 13, "Tokens out of URLs"): ``POST /proto/ticket`` with the
Bearer token answers a single-use ticket, valid at most 30 s and bound to the token's user,
that replaces ``?token=`` on every transport; in a cluster any node redeems it."""

from __future__ import annotations

import time

import pytest
import redis
import requests
from websockets.exceptions import InvalidStatus

from protoflask.tickets import MemoryTicketStore

from ..hardening_support import error_code, request
from ..support import HTTPRefused, SSEClient, StreamClient, WSClient, timeout


def ticket(base_url: str, token: str) -> str:
    response = requests.post(base_url + "/proto/ticket",
                             headers={"Authorization": f"Bearer {token}"}, timeout=timeout(5))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["expires_in_ms"] == 30000 and response.headers["Cache-Control"] == "no-store"
    return body["ticket"]


def test_a_ticket_opens_each_transport_once(make_server):
    server = make_server()
    token = server.issue_token("alice")
    for cls in (WSClient, SSEClient, StreamClient):
        t = ticket(server.base_url, token)
        with cls(server.base_url, None, ticket=t) as client:
            if cls is SSEClient:
                client.token = token  # its upstream POSTs carry the Bearer token
            reply = client.hello()
            assert reply["payload"]["capabilities"]["connect_ticket"] is True
            assert server.get_session(client.session_id)["userId"] == "alice"
        # used: a second connection with it is refused like a bad token
        status, _, body = request(server.base_url, "GET", f"/proto/sse?ticket={t}")
        assert (status, error_code(body)) == (401, "INVALID_TOKEN"), cls


def test_tickets_are_refused_when_unknown_or_for_another_users_session(make_server):
    server = make_server()
    with pytest.raises(InvalidStatus) as refused:
        WSClient(server.base_url, None, ticket="made-up")
    assert refused.value.response.status_code == 401
    alice = server.issue_token("alice")
    with WSClient(server.base_url, alice) as client:
        client.hello()
        sid = client.session_id
    # bob's ticket names bob: alice's session is not his
    t = ticket(server.base_url, server.issue_token("bob"))
    with pytest.raises(HTTPRefused) as other:
        SSEClient(server.base_url, None, ticket=t, session=sid)
    assert other.value.status == 404 and error_code(other.value.body) == "SESSION_NOT_FOUND"
    # a resume with a ticket of the right user works
    with SSEClient(server.base_url, None, ticket=ticket(server.base_url, alice),
                   session=sid) as resumed:
        assert resumed.session_id == sid


def test_a_ticket_needs_a_valid_bearer_token(make_server):
    server = make_server()
    for headers in ({}, {"Authorization": "Bearer nonsense"}):
        response = requests.post(server.base_url + "/proto/ticket", headers=headers,
                                 timeout=timeout(5))
        assert response.status_code == 401
        assert response.json()["error"]["code"] in ("MISSING_TOKEN", "INVALID_TOKEN")
    # a token in the query is not taken here: the point is to keep tokens out of URLs
    token = server.issue_token("alice")
    response = requests.post(f"{server.base_url}/proto/ticket?token={token}",
                             timeout=timeout(5))
    assert response.status_code == 401


def test_a_ticket_expires():
    store = MemoryTicketStore(lifetime_ms=50)
    stale = store.issue("alice")
    fresh_store = MemoryTicketStore()
    fresh = fresh_store.issue("alice")
    time.sleep(0.1)
    assert store.redeem(stale) is None
    assert fresh_store.redeem(fresh) == "alice"
    assert fresh_store.redeem(fresh) is None  # once


def test_query_tokens_keep_working(make_server):
    server = make_server()
    with WSClient(server.base_url, server.issue_token("alice")) as client:
        assert client.hello()["payload"]["session"]


def test_a_ticket_from_one_node_opens_a_connection_on_another(make_server, redis_url, prefix):
    a = make_server(redisUrl=redis_url, redisPrefix=prefix)
    b = make_server(redisUrl=redis_url, redisPrefix=prefix)
    token = a.issue_token("alice")
    t = ticket(a.base_url, token)
    with WSClient(b.base_url, None, ticket=t) as client:
        client.hello()
    with pytest.raises(InvalidStatus):  # once, cluster-wide
        WSClient(a.base_url, None, ticket=t)


def _short_ticket(base_url: str, token: str) -> tuple[str, int]:
    response = requests.post(base_url + "/proto/ticket",
                             headers={"Authorization": f"Bearer {token}"}, timeout=timeout(5))
    assert response.status_code == 200, response.text
    body = response.json()
    return body["ticket"], body["expires_in_ms"]


@pytest.mark.parametrize("clustered", [False, True], ids=["memory", "redis"])
def test_a_ticket_never_outlives_its_token(make_server, redis_url, prefix, clustered):
    """Issue 24: a ticket lived its 30 s even when the token expired sooner. Its expiry is
    now min(ticket lifetime, token exp), in memory and in Redis."""
    config = {"redisUrl": redis_url, "redisPrefix": prefix} if clustered else {}
    server = make_server(**config)
    token = server.issue_token("alice", 2)  # expires within 2 s (exp has whole seconds)
    t, expires_in_ms = _short_ticket(server.base_url, token)
    assert 0 < expires_in_ms <= 2000
    if clustered:  # the Redis key expires with the token, not 30 s later
        client = redis.Redis.from_url(redis_url)
        try:
            pttl = client.pttl(f"{prefix.rstrip(':')}:ticket:{t}")
        finally:
            client.close()
        assert 0 < pttl <= 2000
    time.sleep(expires_in_ms / 1000.0 + 0.2)  # the token has expired; so has its ticket
    with pytest.raises(InvalidStatus) as refused:
        WSClient(server.base_url, None, ticket=t)
    assert refused.value.response.status_code == 401
    # a long-lived token still gets the full lifetime
    assert _short_ticket(server.base_url, server.issue_token("alice"))[1] == 30000
