"""HTTP errors werkzeug raises itself (routing: 404, 405, a WebSocket route without the
upgrade) carry the JSON error body like every other error (docs/PROTOCOL.md, errors).

Standalone (protoflask's own app, embedded server and gunicorn): every path. Mounted on
an application's Flask app: protoflask's own paths only; the application's 404s stay
its own (Flask's page, or its own handler).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import requests
from flask import Flask

from ..support import GunicornServer, timeout


@pytest.fixture(params=["embedded", "gunicorn"])
def any_server(request: pytest.FixtureRequest, make_server: Any) -> Iterator[Any]:
    if request.param == "embedded":
        yield make_server()
        return
    server = GunicornServer()
    try:
        yield server
    finally:
        server.stop()


def call(server: Any, method: str, path: str, **headers: str) -> requests.Response:
    return requests.request(method, server.base_url + path, headers=headers,
                            timeout=timeout(5))


def error_of(resp: requests.Response) -> tuple[int, str, str]:
    assert resp.headers["Content-Type"].startswith("application/json"), resp.text[:200]
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return resp.status_code, body["error"]["code"], body["error"]["message"]


def test_unknown_path_is_json_404(any_server):
    for path in ("/nope", "/proto/nope", "/proto/websocket/extra"):
        status, code, message = error_of(call(any_server, "GET", path))
        assert (status, code) == (404, "NOT_FOUND") and path in message


def test_wrong_method_is_json_405_with_allow(any_server):
    resp = call(any_server, "PUT", "/proto/sse")
    status, code, _ = error_of(resp)
    assert (status, code) == (405, "METHOD_NOT_ALLOWED")
    assert {"GET", "POST"} <= {m.strip() for m in resp.headers["Allow"].split(",")}
    assert error_of(call(any_server, "DELETE", "/health"))[:2] == (405, "METHOD_NOT_ALLOWED")
    assert error_of(call(any_server, "GET", "/proto/stream"))[:2] == \
        (405, "METHOD_NOT_ALLOWED")


def test_routing_errors_carry_cors_headers_so_a_page_can_read_them(make_server):
    server = make_server(allowedOrigins=["https://app.example"])
    resp = call(server, "PUT", "/proto/sse", Origin="https://app.example")
    assert error_of(resp)[:2] == (405, "METHOD_NOT_ALLOWED")
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
    other = call(server, "GET", "/proto/nope", Origin="https://elsewhere.example")
    assert error_of(other)[:2] == (404, "NOT_FOUND")
    assert "Access-Control-Allow-Origin" not in other.headers


def test_websocket_route_without_upgrade_is_426_with_a_proxy_hint(any_server):
    # a proxy that drops hop-by-hop headers: neither Upgrade nor Connection arrive
    for headers in ({}, {"Upgrade": "websocket"}, {"Connection": "Upgrade"},
                    {"Upgrade": "websocket", "Connection": "close"}):
        resp = call(any_server, "GET", "/proto/websocket?token=x", **headers)
        status, code, message = error_of(resp)
        assert (status, code) == (426, "UPGRADE_REQUIRED"), headers
        assert resp.headers["Upgrade"].lower() == "websocket"
        assert "proxy" in message and "Upgrade" in message and "Connection" in message


def test_websocket_upgrade_to_an_http_route_is_400(any_server):
    resp = call(any_server, "GET", "/proto/sse", Upgrade="websocket", Connection="Upgrade",
                **{"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                   "Sec-WebSocket-Version": "13"})
    status, code, message = error_of(resp)
    assert (status, code) == (400, "INVALID_MESSAGE") and "not a WebSocket" in message


def test_embedded_in_an_application_only_protoflask_paths_are_json(make_server):
    app = Flask("someone-elses-app")

    @app.get("/hello")
    def hello() -> str:
        return "hi"

    server = make_server(app=app)
    own = call(server, "GET", "/nope")  # the application's 404: Flask's own page
    assert own.status_code == 404 and own.headers["Content-Type"].startswith("text/html")
    mine = call(server, "POST", "/hello")
    assert mine.status_code == 405 and mine.headers["Content-Type"].startswith("text/html")
    assert error_of(call(server, "GET", "/proto/nope"))[:2] == (404, "NOT_FOUND")
    assert error_of(call(server, "DELETE", "/health"))[:2] == (405, "METHOD_NOT_ALLOWED")
    assert error_of(call(server, "GET", "/proto/websocket"))[:2] == (426, "UPGRADE_REQUIRED")


def test_embedded_application_handlers_keep_their_say(make_server):
    app = Flask("app-with-handlers")

    @app.errorhandler(404)
    def not_found(exc: Any) -> tuple[str, int]:
        return "app's own 404", 404

    from werkzeug.exceptions import HTTPException

    @app.errorhandler(HTTPException)
    def any_http(exc: HTTPException) -> tuple[str, int]:
        return f"app's own {exc.code}", exc.code or 500

    @app.get("/only-get")
    def only_get() -> str:
        return "ok"

    server = make_server(app=app)
    assert call(server, "GET", "/nope").text == "app's own 404"
    # the application's catch-all still answers its own paths after protoflask mounted
    resp = call(server, "POST", "/only-get")
    assert (resp.status_code, resp.text) == (405, "app's own 405")
    assert error_of(call(server, "DELETE", "/health"))[:2] == (405, "METHOD_NOT_ALLOWED")


def _raw(server: Any, data: bytes) -> bytes:
    import socket

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout(5))
    try:
        sock.sendall(data)
        out = b""
        while True:
            piece = sock.recv(65536)
            if not piece:
                return out
            out += piece
    finally:
        sock.close()


def test_embedded_server_answers_unparsable_requests_with_json(make_server):
    """Errors the WSGI server answers before Flask sees the request (the embedded server;
    gunicorn's own parse errors stay gunicorn's)."""
    import orjson

    server = make_server()
    for data, status, code in (
            (b"GARBAGE\r\n\r\n", 400, "INVALID_MESSAGE"),
            (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400,
             "INVALID_MESSAGE"),
            (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "URI_TOO_LONG")):
        out = _raw(server, data)
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), out[:200]
        assert b"content-type: application/json" in head.lower()
        assert orjson.loads(body)["error"]["code"] == code
