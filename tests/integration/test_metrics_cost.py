"""/metrics and /dashboard/data cost the same with 10,000 sessions as with 10 (issue 24):
the session counts are running counts, kept exact where sessions change state (compared
here with the truth through connect, disconnect, resume, a replacing resume and expiry),
and no request walks the sessions: only the heartbeat tick does (/debug/vitals and the
drain's "is a tool busy" included: they read the same running counts)."""

from __future__ import annotations

from typing import Any

import gevent
import requests

from ..support import WSClient, wait_for
from .test_metrics import scrape, value


def truth(server: Any) -> tuple[int, int]:
    held = server.engine.hub.sessions()
    connected = sum(1 for live in held if live.core.connected)
    return connected, len(held) - connected


def gauges(server: Any) -> tuple[int, int]:
    s = scrape(server.base_url)
    metrics = (int(value(s, "protoflask_sessions", state="connected")),
               int(value(s, "protoflask_sessions", state="disconnected")))
    data = requests.get(server.base_url + "/dashboard/data", timeout=5).json()["gauges"]
    assert (data["connected"], data["disconnected"]) == metrics
    return metrics


def settled(server: Any, expected: tuple[int, int]) -> None:
    """The truth reached ``expected`` (transports close asynchronously); then the gauges,
    read without a session walk, equal it exactly."""
    wait_for(lambda: truth(server) == expected, what=f"sessions {expected}")
    assert gauges(server) == expected


def test_session_counts_stay_exact_through_every_state_change(make_server):
    server = make_server(replayWindowTime=60000)
    token = server.issue_token("alice")
    settled(server, (0, 0))
    clients = [WSClient(server.base_url, token) for _ in range(3)]
    for client in clients:
        client.hello()
    settled(server, (3, 0))
    gone = clients.pop()
    sid = gone.session_id
    gone.close()
    settled(server, (2, 1))
    resumed = WSClient(server.base_url, token, session=sid, last_seq=1)
    settled(server, (3, 0))
    # a resume while the session's transport is still open replaces it: one session
    replacing = WSClient(server.base_url, token, session=sid, last_seq=1)
    settled(server, (3, 0))
    replacing.close()
    resumed.close()
    settled(server, (2, 1))
    for client in clients:
        client.close()
    settled(server, (0, 3))


def test_expired_sessions_leave_the_counts(make_server):
    server = make_server(replayWindowTime=300)
    token = server.issue_token("alice")
    clients = [WSClient(server.base_url, token) for _ in range(2)]
    for client in clients:
        client.hello()
    settled(server, (2, 0))
    clients[0].close()
    settled(server, (1, 0))  # disconnected, then expired (300 ms) and forgotten
    clients[1].close()
    settled(server, (0, 0))


def test_no_request_walks_the_sessions(make_server):
    server = make_server(debugVitals=True)
    token = server.issue_token("alice")
    clients = [WSClient(server.base_url, token) for _ in range(5)]
    for client in clients:
        client.hello()
    hub = server.engine.hub
    walk = hub.sessions
    walkers: list[Any] = []

    def recorded() -> Any:
        walkers.append(gevent.getcurrent())
        return walk()

    hub.sessions = recorded
    try:
        wait_for(lambda: walkers, what="a heartbeat tick")  # the instrument records
        for _ in range(3):
            scrape(server.base_url)
            requests.get(server.base_url + "/dashboard/data", timeout=5).raise_for_status()
            vitals = requests.get(server.base_url + "/debug/vitals", timeout=5).json()
            assert (vitals["sessions"], vitals["connectedSessions"]) == (5, 5), vitals
            assert not server.engine.tools_busy()
        ticker = server.engine._ticker.greenlet
        assert ticker is not None
        assert {id(w) for w in walkers} == {id(ticker)}, "a request walked every session"
    finally:
        del hub.sessions
        for client in clients:
            client.close()
