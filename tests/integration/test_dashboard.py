"""The dashboard page and its data over plain HTTP: where the page is served, what
/dashboard/data shows without a token, with one (only the user's own sessions), in
development mode (everything), the per-second history, and the option that turns it off.
The page's behaviour in a real browser is in test_dashboard_browser.py."""

from __future__ import annotations

import requests
from flask import Flask

from ..support import WSClient, wait_for


def data(server, token: str | None = None, **params: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(server.base_url + "/dashboard/data", headers=headers, params=params,
                        timeout=5)


def test_the_page_is_at_the_root_of_protoflasks_own_app(server):
    for path in ("/", "/dashboard"):
        resp = requests.get(server.base_url + path, timeout=5)
        assert resp.status_code == 200
        assert resp.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert '<meta name="protoflask-root" content="/">' in resp.text
        assert "__PROTOFLASK_ROOT__" not in resp.text
    for name, kind in (("app.css", "text/css"), ("dashboard.js", "javascript"),
                       ("playground.js", "javascript"), ("protoclient.mjs", "javascript")):
        resp = requests.get(f"{server.base_url}/dashboard/static/{name}", timeout=5)
        assert resp.status_code == 200 and kind in resp.headers["Content-Type"]
    assert requests.get(server.base_url + "/dashboard/static/../dashboard.py",
                        timeout=5).status_code == 404


def test_an_applications_own_root_is_left_alone(make_server):
    app = Flask("shop")

    @app.get("/")
    def index() -> str:
        return "the shop"

    server = make_server(app=app)
    assert requests.get(server.base_url + "/", timeout=5).text == "the shop"
    assert "protoflask-root" in requests.get(server.base_url + "/dashboard", timeout=5).text


def test_an_application_without_a_root_gets_no_page_there(make_server):
    server = make_server(app=Flask("api"))
    assert requests.get(server.base_url + "/", timeout=5).status_code == 404
    assert requests.get(server.base_url + "/dashboard", timeout=5).status_code == 200


def test_without_a_token_only_aggregates(server, token):
    with WSClient(server.base_url, token) as client:
        client.hello()
        body = data(server).json()
        assert body["access"] == {"user": None, "devMode": False, "sessions": "none"}
        assert "sessions" not in body and "tools" not in body
        assert body["transports"] == {"websocket": {"active": 1, "opened": 1}}
        assert body["gauges"]["connected"] == 1
        stats = server.get_stats()
        assert {k: body["stats"][k] for k in ("totalConnections", "activeConnections",
                                              "totalMessages")} == \
            {k: stats[k] for k in ("totalConnections", "activeConnections", "totalMessages")}


def test_a_token_lists_the_users_own_sessions_and_the_tools(server):
    alice, bob = server.issue_token("alice"), server.issue_token("bob")
    with WSClient(server.base_url, alice) as a, WSClient(server.base_url, bob) as b:
        a.hello()
        b.hello()
        body = data(server, alice).json()
        assert body["access"] == {"user": "alice", "devMode": False, "sessions": "own"}
        assert [s["id"] for s in body["sessions"]] == [a.session_id]
        row = body["sessions"][0]
        assert row["userId"] == "alice" and row["transport"] == "websocket"
        assert row["connected"] is True and row["handshakeCompleted"] is True
        assert row["lastDeliveredSeq"] == 1 and row["lastClientSeq"] == 1
        assert {t["name"] for t in body["tools"]} >= {"echo", "add"}
        add = next(t for t in body["tools"] if t["name"] == "add")
        assert add["inputSchema"]["required"] == ["a", "b"]
        # the token may also come as ?token= (as in the page's URL)
        by_query = requests.get(server.base_url + "/dashboard/data", params={"token": bob},
                                timeout=5).json()
        assert [s["id"] for s in by_query["sessions"]] == [b.session_id]


def test_a_bad_token_is_401(server):
    resp = data(server, "not-a-jwt")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "INVALID_TOKEN"
    resp = data(server, since="soon")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "INVALID_MESSAGE"


def test_development_mode_lists_every_session_without_a_token(make_server):
    server = make_server(devMode=True)
    with WSClient(server.base_url, server.issue_token("alice")) as a, \
            WSClient(server.base_url, server.issue_token("bob")) as b:
        a.hello()
        b.hello()
        body = data(server).json()
        assert body["access"]["sessions"] == "all"
        assert {s["id"] for s in body["sessions"]} == {a.session_id, b.session_id}
        assert body["sessionsListed"] == 2


def test_the_history_has_one_sample_per_second_adding_up_to_the_messages(server, token):
    with WSClient(server.base_url, token) as client:
        client.hello()
        for i in range(5):
            client.send("PING", "SYSTEM", {"nonce": str(i)})
            client.recv_type("PONG")
    total = server.get_stats()["totalMessages"]
    history = wait_for(lambda: (h := data(server).json()["history"])
                       and sum(s[2] for s in h) == total and h,
                       what="the seconds with traffic to be sampled")
    seconds = [s[0] for s in history]
    assert seconds == sorted(seconds) and len(set(seconds)) == len(seconds)
    assert all(b - a == 1000 for a, b in zip(seconds, seconds[1:], strict=False))
    assert any(s[1] == 1 for s in history)  # the connection was open in some second
    newer = data(server, since=str(seconds[-1])).json()["history"]
    assert all(s[0] > seconds[-1] for s in newer)


def test_dashboard_off_is_404(make_server):
    server = make_server(dashboard=False)
    for path in ("/", "/dashboard", "/dashboard/data", "/dashboard/static/app.css"):
        assert requests.get(server.base_url + path, timeout=5).status_code == 404
    assert requests.get(server.base_url + "/metrics", timeout=5).status_code == 200
