"""gunicorn serving TLS itself (``--certfile``/``--keyfile``): a WebSocket works end to end.

A TLS socket cannot be duplicated (the WebSocket is then served in its upgrade request)
and its bytes must go through its TLS layer (never a send on the descriptor under it):
the client here is simple-websocket's, over Python's own TLS, so a frame written in the
clear or a refused upgrade fails it.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys

import orjson
import pytest
import requests
import simple_websocket

from protoflask.auth import TokenAuthority

from ..support import ROOT, SECRET, free_listener, hello_payload, timeout, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    where = tmp_path_factory.mktemp("tls")
    key, cert = where / "key.pem", where / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    listener = free_listener()
    port, fd = listener.getsockname()[1], listener.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--bind",
         f"fd://{fd}", "--certfile", str(cert), "--keyfile", str(key), "wsgi:app"],
        pass_fds=(fd,), env={**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)

    def healthy() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            return requests.get(f"https://127.0.0.1:{port}/health", verify=str(cert),
                                timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(healthy, within=20, what="gunicorn to answer /health over TLS")
        yield port, cert
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=timeout(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        listener.close()


def envelope(session: str, seq: int, mtype: str, payload: dict) -> str:
    return orjson.dumps({"id": f"c{seq}", "session": session, "seq": str(seq), "ts": "1",
                         "type": mtype, "channel": "SYSTEM", "payload": payload}).decode()


def test_websocket_over_tls_served_by_gunicorn(tls_server):
    port, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    token = TokenAuthority(SECRET).issue("tls-user")
    ws = simple_websocket.Client(f"wss://127.0.0.1:{port}/proto/websocket?token={token}",
                                 ssl_context=context)
    try:
        ws.send(envelope("", 1, "HELLO", hello_payload()))
        hello = orjson.loads(ws.receive(timeout=timeout(5)))
        assert hello["type"] == "HELLO"
        session = hello["payload"]["session"]
        for seq in range(2, 52):  # many writes on the TLS socket, each answered in order
            ws.send(envelope(session, seq, "PING", {"nonce": f"n{seq}"}))
            pong = orjson.loads(ws.receive(timeout=timeout(5)))
            assert (pong["type"], pong["payload"]["nonce"]) == ("PONG", f"n{seq}")
    finally:
        ws.close()
