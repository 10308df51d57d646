"""The dashboard's operator actions over plain HTTP against a live server with real
clients: off unless ``operatorToken`` is set (404), refused without it or with a user's
JWT (401), and with it a session's client really receives what is sent, is really
disconnected, and every connected client receives a broadcast. The page's buttons are
driven in Chromium in test_dashboard_operator_browser.py."""

from __future__ import annotations

import pytest
import requests

from protoflask.config import ConfigError, ServerConfig

from ..support import SSEClient, WSClient, wait_for

OPERATOR = "operator-credential-0123456789"
NOTICE = {"type": "OPERATOR_NOTICE", "channel": "AGENT", "payload": {"text": "maintenance"}}


def post(server, path: str, body=None, token: str | None = OPERATOR,
         data: bytes | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(server.base_url + path, json=body if data is None else None,
                         data=data, headers=headers, timeout=5)


@pytest.fixture
def operated(make_server):
    return make_server(operatorToken=OPERATOR)


def test_off_unless_configured(server, token):
    with WSClient(server.base_url, token) as client:
        client.hello()
        # the page asks, and shows no operator controls
        assert requests.get(server.base_url + "/dashboard/operator", timeout=5).json() == \
            {"operatorActions": False}
        assert requests.get(server.base_url + "/dashboard/operator/data",
                            headers={"Authorization": f"Bearer {OPERATOR}"},
                            timeout=5).status_code == 404
        for path in (f"/dashboard/sessions/{client.session_id}/disconnect",
                     f"/dashboard/sessions/{client.session_id}/send", "/dashboard/broadcast"):
            resp = post(server, path, NOTICE)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["code"] == "NOT_FOUND"
        assert client.is_open()
        assert not [m for m in client.received if m["type"] == NOTICE["type"]]


def test_a_user_token_is_not_an_operator_credential(operated):
    user_token = operated.issue_token("alice")
    with WSClient(operated.base_url, user_token) as client:
        client.hello()
        path = f"/dashboard/sessions/{client.session_id}/send"
        refused = {"text": "refused"}
        for token, code in ((None, "MISSING_TOKEN"), (user_token, "INVALID_TOKEN"),
                            (OPERATOR + "x", "INVALID_TOKEN"), (OPERATOR[:-1], "INVALID_TOKEN")):
            for target in (path, "/dashboard/broadcast",
                           f"/dashboard/sessions/{client.session_id}/disconnect"):
                resp = post(operated, target, {**NOTICE, "payload": refused}, token=token)
                assert resp.status_code == 401, (target, token)
                assert resp.json()["error"]["code"] == code
        # nothing refused reached the client: the first notice it gets is the operator's
        assert post(operated, path, NOTICE).json() == {"session": client.session_id,
                                                       "sent": True}
        got = client.recv_type(NOTICE["type"])
        assert got["payload"] == NOTICE["payload"]
        assert client.is_open()


def test_send_reaches_only_that_session(operated):
    with WSClient(operated.base_url, operated.issue_token("alice")) as target, \
            SSEClient(operated.base_url, operated.issue_token("bob")) as other:
        target.hello()
        other.hello()
        resp = post(operated, f"/dashboard/sessions/{target.session_id}/send", NOTICE)
        assert resp.status_code == 200
        got = target.recv_type(NOTICE["type"])
        assert got["channel"] == "AGENT" and got["session"] == target.session_id
        assert got["payload"] == NOTICE["payload"]
        # the other session hears a broadcast, not the message sent to the first
        post(operated, "/dashboard/broadcast", {**NOTICE, "payload": {"text": "all"}})
        first = other.recv_type(NOTICE["type"])
        assert first["payload"] == {"text": "all"}


def test_broadcast_reaches_every_connected_client(operated):
    with WSClient(operated.base_url, operated.issue_token("alice")) as ws, \
            SSEClient(operated.base_url, operated.issue_token("bob")) as sse:
        ws.hello()
        sse.hello()
        resp = post(operated, "/dashboard/broadcast", NOTICE)
        assert resp.status_code == 200 and resp.json() == {"reached": 2}
        for client in (ws, sse):
            assert client.recv_type(NOTICE["type"])["payload"] == NOTICE["payload"]


def test_disconnect_closes_the_sessions_transport(operated):
    with WSClient(operated.base_url, operated.issue_token("alice")) as client, \
            WSClient(operated.base_url, operated.issue_token("bob")) as bystander:
        client.hello()
        bystander.hello()
        resp = post(operated, f"/dashboard/sessions/{client.session_id}/disconnect")
        assert resp.status_code == 200
        assert resp.json() == {"session": client.session_id, "disconnected": True}
        wait_for(lambda: not client.is_open(), what="the client's connection closed")
        assert client.close_code == 1001
        assert client.ws.close_reason == "disconnected by an operator"
        assert bystander.is_open()
        # the session stays for resume (docs/PROTOCOL.md §6.2); a second disconnect finds
        # no transport left
        wait_for(lambda: operated.get_session(client.session_id)["connected"] is False)
        again = post(operated, f"/dashboard/sessions/{client.session_id}/disconnect")
        assert again.json() == {"session": client.session_id, "disconnected": False}


def test_bad_input_gets_the_contracts_codes(make_server):
    server = make_server(operatorToken=OPERATOR, maxMessageSize=1024)
    assert requests.get(server.base_url + "/dashboard/operator", timeout=5).json() == \
        {"operatorActions": True}
    with WSClient(server.base_url, server.issue_token("alice")) as client:
        client.hello()
        send = f"/dashboard/sessions/{client.session_id}/send"
        cases = [
            ("/dashboard/sessions/nope/send", NOTICE, None, 404, "SESSION_NOT_FOUND"),
            ("/dashboard/sessions/nope/disconnect", None, None, 404, "SESSION_NOT_FOUND"),
            (send, None, b"{not json", 400, "INVALID_MESSAGE"),
            (send, None, b"", 400, "INVALID_MESSAGE"),
            (send, ["a", "list"], None, 400, "INVALID_MESSAGE"),
            (send, {"type": "X", "payload": {}}, None, 400, "INVALID_MESSAGE"),
            (send, {**NOTICE, "payload": "text"}, None, 400, "INVALID_MESSAGE"),
            ("/dashboard/broadcast", {"channel": "AGENT"}, None, 400, "INVALID_MESSAGE"),
            (send, {**NOTICE, "payload": {"text": "x" * 2000}}, None, 413,
             "MESSAGE_TOO_LARGE"),
            ("/dashboard/broadcast", None, b"{" + b" " * 5000 + b"}", 413,
             "MESSAGE_TOO_LARGE"),
        ]
        for path, body, data, status, code in cases:
            resp = post(server, path, body, data=data)
            assert resp.status_code == status, (path, body, data, resp.text)
            assert resp.json()["error"]["code"] == code, (path, body, data)
        resp = requests.get(server.base_url + send, timeout=5)
        assert resp.status_code == 405
        # the session lost nothing: it is connected and still receives
        assert post(server, send, NOTICE).status_code == 200
        assert client.recv_type(NOTICE["type"])["payload"] == NOTICE["payload"]


def test_the_setting():
    base = {"jwtSecret": "s" * 32}
    assert ServerConfig.load(base, environ={}).operator_token is None
    loaded = ServerConfig.load(base, environ={"OPERATOR_TOKEN": f"  {OPERATOR} "})
    assert loaded.operator_token == OPERATOR
    assert loaded.to_public_dict()["operatorToken"] == "***"
    assert OPERATOR not in repr(loaded)
    assert ServerConfig.load(base, environ={"OPERATOR_TOKEN": ""}).operator_token is None
    with pytest.raises(ConfigError, match="operatorToken must be at least 16"):
        ServerConfig.load({**base, "operatorToken": "short"}, environ={})
    assert ServerConfig.load(base, app_config={"PROTOFLASK_OPERATOR_TOKEN": OPERATOR},
                             environ={}).operator_token == OPERATOR


def test_the_operator_sees_every_users_sessions(operated):
    with WSClient(operated.base_url, operated.issue_token("alice")) as alice, \
            WSClient(operated.base_url, operated.issue_token("bob")) as bob:
        alice.hello()
        bob.hello()
        url = operated.base_url + "/dashboard/operator/data"
        body = requests.get(url, headers={"Authorization": f"Bearer {OPERATOR}"},
                            timeout=5).json()
        assert body["access"] == {"user": None, "devMode": False, "sessions": "all",
                                  "operator": True}
        assert {s["id"]: s["userId"] for s in body["sessions"]} == \
            {alice.session_id: "alice", bob.session_id: "bob"}
        for headers, code in (({}, "MISSING_TOKEN"),
                              ({"Authorization": f"Bearer {operated.issue_token('alice')}"},
                               "INVALID_TOKEN")):
            resp = requests.get(url, headers=headers, timeout=5)
            assert resp.status_code == 401 and resp.json()["error"]["code"] == code
            assert "sessions" not in resp.json()
        resp = requests.get(url + "?since=abc", headers={"Authorization": f"Bearer {OPERATOR}"},
                            timeout=5)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "INVALID_MESSAGE"
