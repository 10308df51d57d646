"""The dashboard in a cluster: two nodes on one Redis (this test's own key prefix). A poll
answered by either node shows the same cluster-wide figures and the user's own sessions
wherever they are held, and says whose figures it shows."""

from __future__ import annotations

import requests

from ..support import WSClient, wait_for


def data(node, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = requests.get(node.base_url + "/dashboard/data", headers=headers, timeout=5)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_either_node_shows_the_cluster_and_the_users_sessions(make_node):
    a, b = make_node(), make_node()
    alice = a.issue_token("alice")
    with WSClient(a.base_url, alice) as on_a, WSClient(b.base_url, alice) as on_b, \
            WSClient(b.base_url, b.issue_token("bob")) as bob:
        ids = {on_a.hello()["payload"]["session"], on_b.hello()["payload"]["session"]}
        bob.hello()

        def both_nodes_see_everything() -> bool:
            views = [data(a, alice), data(b, alice)]
            return all(v["stats"]["activeConnections"] == 3 for v in views) and views
        from_a, from_b = wait_for(both_nodes_see_everything, within=10,
                                  what="both nodes' reports in Redis")
        for view, node in ((from_a, a), (from_b, b)):
            assert view["scope"]["stats"] == "cluster" and view["scope"]["nodes"] == 2
            assert view["node"] == node.hub.node_id
            assert len(view["stats"]["nodes"]) == 2
            # alice's two sessions, one held here and one on the other node; not bob's
            assert {s["id"] for s in view["sessions"]} == ids, view["sessions"]
            assert view["sessionsListed"] == 2 and view["sessionsComplete"] is True
            assert {s["node"] for s in view["sessions"]} == {a.hub.node_id, b.hub.node_id}
            assert all(s["userId"] == "alice" and s["connected"] for s in view["sessions"])
            # the transports line is the answering node's own (and says so in scope)
            assert view["scope"]["transports"] == "node"
            assert view["transports"]["websocket"]["active"] == (1 if node is a else 2)

        # without a token: aggregates only, still cluster-wide
        public = data(b)
        assert "sessions" not in public and public["stats"]["activeConnections"] == 3


def test_one_server_says_its_figures_are_its_own(make_server):
    server = make_server()
    view = data(server)
    assert view["scope"]["stats"] == "server" and view["scope"]["nodes"] == 1
    assert view["node"] is None


def test_the_page_says_whose_figures_it_shows(make_node):
    """In Chromium: the page names the answering node, calls the stats cluster-wide,
    marks the transports line as this node's, and lists the session another node holds."""
    from ..integration.test_browser import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    from playwright.sync_api import sync_playwright

    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    with WSClient(b.base_url, token) as elsewhere:
        remote_id = elsewhere.hello()["payload"]["session"]
        wait_for(lambda: data(a, token)["scope"]["nodes"] == 2, within=10, what="two nodes")
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = chromium.new_page()
                page.goto(f"{a.base_url}/#token={token}")
                rows = f"#sessions tr[data-session='{remote_id}']"
                wait_for(lambda: page.query_selector(rows) is not None, within=10,
                         what="the other node's session in the table")
                scope = page.inner_text("#dash-scope")
                assert "Cluster-wide figures (2 live nodes)" in scope
                assert f"answered by node {a.hub.node_id}" in scope
                assert page.inner_text("#stat-transports") == "this node: none"
                assert f"on node {b.hub.node_id}" in page.inner_text(rows)
            finally:
                chromium.close()
