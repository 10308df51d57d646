"""The standalone deployment: ``gunicorn wsgi:app`` with gunicorn.conf.py in a subprocess
(protoflask/gunicorn_worker.py is its worker class)."""

from __future__ import annotations

import signal

import pytest
import requests
from websockets.exceptions import ConnectionClosed

from ..support import SECRET, GunicornServer, WSClient, timeout

from protoflask.auth import TokenAuthority


@pytest.fixture(scope="module")
def gunicorn_server():
    server = GunicornServer()
    try:
        yield server
    finally:
        server.stop()


def token_for(user: str) -> str:
    return TokenAuthority(SECRET).issue(user)


def test_health_and_stats(gunicorn_server):
    health = requests.get(gunicorn_server.base_url + "/health", timeout=5).json()
    assert health["status"] == "ok" and health["uptime"] >= 0
    stats = requests.get(gunicorn_server.base_url + "/stats", timeout=5).json()
    assert {"totalConnections", "activeConnections", "totalMessages", "messagesPerSecond",
            "averageLatency", "errorRate", "uptime"} <= set(stats)


def test_every_flow_over_websocket(gunicorn_server):
    with WSClient(gunicorn_server.base_url, token_for("g")) as client:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": "g1"})
        client.recv_type("PONG", nonce="g1")
        client.send("TOOL_CALL", payload={"call_id": "t", "tool": "add",
                                          "params": {"a": 20, "b": 22}})
        assert client.recv_type("TOOL_DONE")["payload"]["result"] == {"result": 42}
        client.send("MESSAGE_START", payload={"message_id": "m", "content_type": "text/plain"})
        client.send("MESSAGE_PART", payload={"message_id": "m", "content": "hi"})
        client.send("MESSAGE_END", payload={"message_id": "m"})
        client.recv_type("MESSAGE_END")
        assert [m["payload"]["content"] for m in client.received
                if m["type"] == "MESSAGE_PART"] == ["hi"]
        client.send_raw("not json")
        client.expect_error("INVALID_MESSAGE")


def test_refusal_before_upgrade(gunicorn_server):
    response = requests.get(gunicorn_server.base_url + "/proto/websocket", headers={
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, timeout=5)
    assert response.status_code == 401
    assert response.json() == {"error": {"code": "MISSING_TOKEN",
                                         "message": "a token is required"}}


@pytest.mark.parametrize("args", [(), ("-k", "gevent")], ids=["worker_class", "-k gevent"])
def test_sigterm_closes_clients_with_1001(args):
    """The drain is protoflask's worker class (gunicorn.conf.py names it); the README's
    ``-k gevent`` overrides the file's worker_class and still gets it."""
    server = GunicornServer(args=args)
    try:
        client = WSClient(server.base_url, token_for("t"))
        try:
            client.hello()
            server.proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed):
                while True:
                    client.ws.recv(timeout=timeout(8))
            assert client.ws.close_code == 1001
        finally:
            client.close()
    finally:
        server.stop()


def test_several_workers_are_refused_without_a_shared_session_store():
    import os
    import subprocess
    import sys

    from ..support import ROOT, free_listener

    listener = free_listener()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "--bind", f"fd://{listener.fileno()}", "--chdir", str(ROOT), "-w", "2",
             "wsgi:app"],
            pass_fds=(listener.fileno(),), capture_output=True, text=True,
            env={**os.environ, "JWT_SECRET": SECRET}, timeout=timeout(30))
    finally:
        listener.close()
    assert proc.returncode != 0
    assert "2 workers configured" in proc.stdout + proc.stderr
