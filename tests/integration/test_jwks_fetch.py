"""The JWKS fetch against real HTTP servers that misbehave (issue 24, item 4): one that
trickles its answer a byte at a time, and one that redirects. A fetch has a total
deadline (``FETCH_TIMEOUT``), follows no redirect, and a slow fetch neither holds the
worker nor keeps the key set from being refreshed once the provider answers again."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
import requests

from protoflask.jwks import fetch_json

from ..support import timeout, wait_for
from .test_identity_provider import RSA_KEY, KeyServer, sign

TRICKLE = 40  # bytes, one every TRICKLE_GAP seconds: 8 s in all, each read well in time
TRICKLE_GAP = 0.2


class Misbehaving:
    """An HTTP server on a free port: ``/trickle`` sends a JSON body a byte at a time
    (while ``trickling``, else at once); ``/redirect`` sends a 302 to ``target``."""

    def __init__(self, target: str = "") -> None:
        self.trickling = True
        self.requests = 0
        self.stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = owner.body if not owner.trickling else b" " * (TRICKLE - 2) + b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not owner.trickling:
                    self.wfile.write(body)
                    return
                for byte in body:
                    if owner.stop.wait(TRICKLE_GAP):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *args: Any) -> None:
                pass

        self.body = b"{}"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def accepted(server: Any, token: str) -> bool:
    """Whether the token gets a connect ticket (200) rather than a 401; over HTTP, which
    waits for a fetch under way longer than a WebSocket handshake does."""
    resp = requests.post(server.base_url + "/proto/ticket", timeout=timeout(30),
                         headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code in (200, 401), resp.text
    return resp.status_code == 200


@pytest.fixture
def idp() -> Iterator[KeyServer]:
    server = KeyServer()
    yield server
    server.close()


def test_a_trickling_answer_is_given_up_at_the_total_deadline() -> None:
    server = Misbehaving()
    try:
        with pytest.raises((TimeoutError, socket.timeout)):
            fetch_json(server.base + "/trickle", deadline=1.0)
    finally:
        server.close()


def test_a_redirect_is_not_followed(idp) -> None:
    idp.publish(RSA_KEY, "k")
    server = Misbehaving(target=idp.url)
    try:
        with pytest.raises(Exception, match="302|redirect"):
            fetch_json(server.base + "/redirect")
        assert idp.requests == 0
    finally:
        server.close()


def test_a_trickling_provider_holds_neither_the_worker_nor_the_refresh(make_server, idp):
    idp.publish(RSA_KEY, "k")
    server_ = Misbehaving()
    server_.body = json.dumps({"keys": idp.keys}).encode()
    try:
        server = make_server(jwtSecret=None, jwksUrl=server_.base + "/trickle",
                             jwksRefreshInterval=200)
        token = sign(RSA_KEY, "RS256", "k")
        first: list[bool] = []
        attempt = threading.Thread(target=lambda: first.append(accepted(server, token)),
                                   daemon=True)
        attempt.start()
        wait_for(lambda: server_.requests >= 1, what="the first fetch to start")
        # the worker answers others while that fetch trickles
        health = requests.get(server.base_url + "/health", timeout=timeout(5))
        answered_while_trickling = attempt.is_alive()
        assert health.status_code == 200 and answered_while_trickling
        attempt.join(timeout(30))
        assert first == [False]  # the fetch failed at its deadline: 401, no keys yet
        server_.trickling = False  # the provider is fixed: the next refresh gets the keys
        wait_for(lambda: accepted(server, token), within=timeout(20),
                 what="the keys once the provider answers")
    finally:
        server_.close()
