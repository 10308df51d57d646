"""Security on every transport: forged and expired tokens, tokens kept out of logs, the
Origin allow-list, sessions that only their user can reach, the per-session rate limit,
and the limits on numbers and nesting that keep hostile input a contract error."""

from __future__ import annotations

import logging
import time
import warnings

import jwt
import orjson
from websockets.exceptions import ConnectionClosed
import pytest
import requests

from protoflask import ProtoServer
from protoflask.config import ConfigError, ServerConfig

from ..hardening_support import (
    HELLO, UPGRADE_HEADERS, call_endpoint, endpoints, envelope, error_code, forged_token,
    raw_exchange, request, status_of,
)
from ..support import SECRET, GunicornServer, SSEClient, StreamClient, WSClient, timeout, wait_for


def now() -> int:
    """The time a token's claims are made at: when the test makes it, not when the module
    was collected (a suite longer than ten minutes outlived a token of NOW + 600)."""
    return int(time.time())


OTHER_KEY = "another-secret-that-is-long-enough-for-hs256!!"

def _quiet_encode(claims: dict, key: str, algorithm: str) -> str:
    """Signed with the server's own secret but an algorithm it does not accept (PyJWT
    warns that the secret is short for HS512: that is not what is tested)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jwt.encode(claims, key, algorithm=algorithm)


BAD_TOKENS = {
    "wrong-algorithm": lambda: _quiet_encode({"sub": "alice"}, SECRET, "HS512"),
    "wrong-key": lambda: jwt.encode({"sub": "alice"}, OTHER_KEY, algorithm="HS256"),
    "alg-none": lambda: jwt.encode({"sub": "alice"}, None, algorithm="none"),
    "alg-None-forged": lambda: forged_token({"alg": "None", "typ": "JWT"}, {"sub": "alice"}),
    "alg-none-with-signature": lambda: forged_token({"alg": "none"}, {"sub": "alice"}, b"x" * 32),
    "rs256-header-hmac-signed": lambda: forged_token({"alg": "RS256"}, {"sub": "alice"},
                                                     b"\x00" * 256),
    "expired": lambda: jwt.encode({"sub": "alice", "exp": now() - 30}, SECRET, algorithm="HS256"),
    "not-yet-valid": lambda: jwt.encode({"sub": "alice", "nbf": now() + 3600, "exp": now() + 7200},
                                        SECRET, algorithm="HS256"),
    "no-exp": lambda: jwt.encode({"sub": "alice"}, SECRET, algorithm="HS256"),  # jwtRequireExp
    "no-user-claim": lambda: jwt.encode({"name": "alice", "exp": now() + 60}, SECRET,
                                        algorithm="HS256"),
    "empty-sub": lambda: jwt.encode({"sub": "", "exp": now() + 60}, SECRET, algorithm="HS256"),
    "garbage": lambda: "a.b.c",
}


@pytest.fixture(scope="module")
def shared_server():
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})
    server.start()
    server.base_url = f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


# -- tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", sorted(endpoints()))
@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_bad_tokens_are_401_invalid_token_everywhere(shared_server, endpoint, kind):
    status, _, body = call_endpoint(shared_server.base_url, endpoint, BAD_TOKENS[kind]())
    assert (status, error_code(body)) == (401, "INVALID_TOKEN"), body


@pytest.mark.parametrize("endpoint", sorted(endpoints()))
def test_no_token_is_401_missing_token_everywhere(shared_server, endpoint):
    status, _, body = call_endpoint(shared_server.base_url, endpoint, None)
    assert (status, error_code(body)) == (401, "MISSING_TOKEN"), body


@pytest.mark.parametrize("endpoint", ["websocket", "sse", "stream"])
def test_a_valid_token_opens_every_transport(shared_server, endpoint):
    """The refusals above are the tokens' fault: the same request with a good one opens."""
    status, _, _ = call_endpoint(shared_server.base_url, endpoint,
                                 shared_server.issue_token("alice"))
    assert status in (101, 200)


# -- tokens never reach a log ---------------------------------------------------------------


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(logging.getLogger("protoflask"), "propagate", True)
    caplog.set_level(logging.INFO, logger="protoflask")
    return caplog


def exercise_with_tokens(base_url: str, token: str, bogus: str) -> None:
    """Every way a token reaches the server, valid or not, on the wire and in the query."""
    for name in ("websocket", "sse", "stream"):
        call_endpoint(base_url, name, token)
        call_endpoint(base_url, name, bogus)
    for name in ("sse-post", "stream-post", "stream-resume"):
        call_endpoint(base_url, name, token)
        call_endpoint(base_url, name, token, query_token=True)
    request(base_url, "GET", f"/health?token={token}")
    request(base_url, "GET", f"/health?%74oken={token}")  # the query parser decodes the key
    request(base_url, "GET", f"/proto/sse?%74oken={bogus}")
    request(base_url, "GET", "/stats", {"Authorization": f"Bearer {token}"})
    # malformed request lines, which servers quote in their error logs
    raw_exchange(base_url, f"GET /proto/sse?token={token} HTTP/9.9\r\nHost: x\r\n\r\n".encode(),
                 wait=2)
    raw_exchange(base_url, f"GET /proto/sse?token={token} HTTP/1.1 extra\r\n\r\n".encode(),
                 wait=2)
    client = WSClient(base_url, token)
    client.hello()
    client.close()


def test_tokens_never_logged_by_the_embedded_server(make_server, logs):
    server = make_server(enableLogging=True)
    token = server.issue_token("alice")
    bogus = "bogus.token-value.that-must-not-leak"
    exercise_with_tokens(server.base_url, token, bogus)
    wait_for(lambda: any("websocket closed" in r.getMessage() for r in logs.records),
             what="the close line")
    lines = [r.getMessage() + repr(r.args) + (r.exc_text or "") for r in logs.records]
    assert any("token=[redacted]" in line for line in lines)
    assert any("HTTP/9.9" in line for line in lines)  # the error log line was written...
    for line in lines:  # ...and, like every other, without the token
        assert token.split(".")[2] not in line, line
        assert "token-value" not in line, line


def test_tokens_never_logged_by_gunicorn():
    """gunicorn's own access log (when enabled) and error log, and protoflask's lines."""
    gunicorn = GunicornServer(env={
        "ENABLE_LOGGING": "true",
        "GUNICORN_CMD_ARGS": "--access-logfile - --error-logfile - --log-level info "
                             "--access-logformat '%(r)s %(q)s %(U)s %({authorization}i)s %(s)s'"})
    try:
        token = jwt.encode({"sub": "alice", "exp": now() + 600}, SECRET, algorithm="HS256")
        bogus = "bogus.token-value.that-must-not-leak"
        exercise_with_tokens(gunicorn.base_url, token, bogus)
    finally:
        output = gunicorn.stop()
    assert "token=[redacted]" in output and "GET /health" in output  # the access log was on
    assert "Bearer ***" in output or "***" in output
    assert token.split(".")[2] not in output
    assert "token-value" not in output


# -- Origin allow-list ------------------------------------------------------------------------


ALLOWED = "https://app.example.com"


@pytest.fixture(scope="module")
def origin_server():
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False,
                          "allowedOrigins": [ALLOWED, "https://*.example.org"]})
    server.start()
    server.base_url = f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("endpoint", sorted(endpoints()))
@pytest.mark.parametrize("origin", ["https://evil.example", "null", "https://app.example.com.evil",
                                    "http://app.example.com", "https://example.org"])
def test_foreign_origins_are_refused_before_anything(origin_server, endpoint, origin):
    token = origin_server.issue_token("alice")
    status, headers, body = call_endpoint(origin_server.base_url, endpoint, token,
                                          headers={"Origin": origin})
    assert (status, error_code(body)) == (403, "ORIGIN_NOT_ALLOWED"), body
    assert "access-control-allow-origin" not in headers
    assert origin_server.get_stats()["activeConnections"] == 0


@pytest.mark.parametrize("origin", [ALLOWED, "https://a.example.org", None])
def test_allowed_origins_and_non_browser_clients_get_in(origin_server, make_client, origin):
    headers = {"Origin": origin} if origin else None
    client = make_client(origin_server, origin_server.issue_token("alice"), headers=headers)
    client.hello()
    client.send("PING", "SYSTEM", {"nonce": "o"})
    client.recv_type("PONG", nonce="o")
    if isinstance(client, SSEClient):  # its POSTs carry no Origin here; a browser's would
        resp = client.post(orjson.dumps(envelope("PING", payload={"nonce": "p"}, seq=99)),
                           headers=headers)
        assert resp.status_code == 202
        if origin:
            assert resp.headers["Access-Control-Allow-Origin"] == origin
    client.close()


def test_cors_only_names_allowed_origins(origin_server):
    base = origin_server.base_url
    good = requests.options(base + "/proto/sse", timeout=timeout(5), headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST"})
    assert good.headers["Access-Control-Allow-Origin"] == ALLOWED
    evil = requests.options(base + "/proto/sse", timeout=timeout(5), headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert evil.status_code == 403 and "Access-Control-Allow-Origin" not in evil.headers
    health = requests.get(base + "/health", timeout=timeout(5),
                          headers={"Origin": "https://evil.example"})
    assert health.status_code == 200 and "Access-Control-Allow-Origin" not in health.headers


def test_without_a_list_any_origin_is_allowed_and_echoed(shared_server):
    status, headers, _ = call_endpoint(shared_server.base_url, "sse-post",
                                       shared_server.issue_token("a"),
                                       headers={"Origin": "https://anywhere.example"})
    assert status == 404  # no such session: the Origin was not what stopped it
    assert headers["access-control-allow-origin"] == "https://anywhere.example"


def test_allowed_origins_config(monkeypatch, caplog):
    monkeypatch.setenv("ALLOWED_ORIGINS", "https://A.example.com:443/, http://localhost:3000")
    config = ServerConfig.load({"jwtSecret": "s"})
    assert config.allowed_origins == ("https://a.example.com", "http://localhost:3000")
    with pytest.raises(ConfigError, match="allowedOrigins"):
        ServerConfig.load({"jwtSecret": "s", "allowedOrigins": ["app.example.com/path"]})
    monkeypatch.delenv("ALLOWED_ORIGINS")
    assert ServerConfig.load({"jwtSecret": "s"}).allowed_origins == ()
    # an empty list in production is allowed, with a warning at start
    caplog.set_level(logging.WARNING, logger="protoflask")
    monkeypatch.setattr(logging.getLogger("protoflask"), "propagate", True)
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})
    server.start()
    server.stop()
    assert any("allowedOrigins is empty" in r.getMessage() for r in caplog.records)


# -- nobody reaches another user's session ----------------------------------------------------


@pytest.mark.parametrize("owner_transport", ["websocket", "sse", "stream"])
def test_no_way_into_another_users_session(server, make_client, owner_transport):
    alice = make_client(server, server.issue_token("alice"), transport=owner_transport)
    alice.hello()
    sid = alice.session_id
    before = server.get_session(sid)
    bob = server.issue_token("bob")
    base = server.base_url
    attempts = {
        "websocket resume": request(base, "GET",
                                    f"/proto/websocket?token={bob}&session={sid}&last_seq=0",
                                    UPGRADE_HEADERS),
        "sse resume": request(base, "GET", f"/proto/sse?token={bob}&session={sid}&last_seq=0"),
        "sse Last-Event-ID": request(base, "GET", f"/proto/sse?token={bob}",
                                     {"Last-Event-ID": f"{sid}:0"}),
        "sse post": call_endpoint(base, "sse-post", bob, sid),
        "stream post": call_endpoint(base, "stream-post", bob, sid),
        "stream resume": call_endpoint(base, "stream-resume", bob, sid),
    }
    for what, (status, _, body) in attempts.items():
        assert (status, error_code(body)) == (404, "SESSION_NOT_FOUND"), (what, body)
    after = server.get_session(sid)
    assert after["connected"] and after["lastClientSeq"] == before["lastClientSeq"]
    assert after["lastDeliveredSeq"] == before["lastDeliveredSeq"]  # nothing sent to alice
    alice.send("PING", "SYSTEM", {"nonce": "mine"})
    assert alice.recv()["payload"] == {"nonce": "mine"}  # the next thing she gets is hers


# -- rate limit --------------------------------------------------------------------------------


def test_over_the_rate_limit_messages_are_dropped_and_may_be_resent(make_server, make_client):
    server = make_server(rateLimit=5, rateLimitBurst=4)
    client = make_client(server, server.issue_token("alice"))
    client.hello()  # token 1 of 4
    sent = [client.send("PING", "SYSTEM", {"nonce": f"p{i}"}) for i in range(5)]
    limited = client.expect_error("RATE_LIMITED")
    assert limited["payload"]["detail"]["retry_after_ms"] > 0
    pongs = {m["payload"]["nonce"] for m in client.received if m["type"] == "PONG"}
    dropped = [e for e in sent if e["payload"]["nonce"] not in pongs]
    assert dropped, "at least one PING was over the limit"
    # a dropped message was not read: resent as it was (same seq) once the time the server
    # named has passed, it is processed (the limit is a rate: this wait is the subject)
    wait_ms = max(m["payload"]["detail"]["retry_after_ms"] for m in client.received
                  if m["type"] == "ERROR" and m["payload"]["code"] == "RATE_LIMITED")
    time.sleep(wait_ms / 1000 + 0.05)
    client.send_raw(orjson.dumps(dropped[-1]).decode())
    client.recv_type("PONG", nonce=dropped[-1]["payload"]["nonce"])
    assert server.get_stats()["activeConnections"] == 1  # not closed for that


def test_a_flood_is_closed_with_1008(make_server, make_client, transport):
    server = make_server(rateLimit=2, rateLimitBurst=3)
    client = make_client(server, server.issue_token("alice"))
    client.hello()
    if isinstance(client, SSEClient):  # one POST with the whole flood
        client.post(b"\n".join(orjson.dumps(envelope("PING", payload={"nonce": str(i)},
                                                     seq=10 + i)) for i in range(20)))
    else:
        for i in range(20):
            try:
                client.send("PING", "SYSTEM", {"nonce": str(i)})
            except (OSError, ConnectionClosed):  # closed already: a fast server
                break
    client.expect_error("RATE_LIMITED")
    if isinstance(client, WSClient):
        wait_for(lambda: client.close_code is not None or not client.is_open(),
                 what="the close")
        assert client.close_code == 1008
    else:
        client.wait_ended()
        if isinstance(client, SSEClient):
            assert client.close_code == 1008
    errors = [m for m in client.received if m["type"] == "ERROR"]
    assert len(errors) <= 4, "one ERROR per dropped message until the close, no more"
    wait_for(lambda: server.get_stats()["activeConnections"] == 0, what="the slot back")


def test_rate_limit_can_be_turned_off(make_server, make_client):
    server = make_server(rateLimit=0, rateLimitBurst=1)
    client = make_client(server, server.issue_token("alice"))
    client.hello()
    for i in range(30):
        client.send("PING", "SYSTEM", {"nonce": str(i)})
    client.recv_type("PONG", nonce="29")
    assert not [m for m in client.received if m["type"] == "ERROR"]


# -- numbers and nesting -----------------------------------------------------------------------


def deep_envelope(depth: int, seq: int) -> bytes:
    opening = b'{"k":' * depth
    return (b'{"id":"d","session":"","seq":"%d","ts":"1","type":"PING","channel":"SYSTEM",'
            b'"payload":{"nonce":"n","deep":' % seq) + opening + b"1" + b"}" * depth + b"}}"


@pytest.mark.parametrize("frame", [
    deep_envelope(70, 2),
    deep_envelope(600, 2),
    orjson.dumps(envelope("PING", payload={"nonce": "n"}, seq="9" * 5000)),
    orjson.dumps({**envelope("PING", payload={"nonce": "n"}, seq=2), "ts": "7" * 5000}),
    orjson.dumps(envelope("ACK", payload={"seq": "9" * 5000}, seq=2)),
    orjson.dumps(envelope("REPLAY_REQUEST", payload={"from_seq": "١"}, seq=2)),
], ids=["depth-70", "depth-600", "seq-5000-digits", "ts-5000-digits", "ack-5000-digits",
        "arabic-digit"])
def test_hostile_numbers_and_nesting_are_invalid_message(server, make_client, frame):
    client = make_client(server, server.issue_token("alice"))
    client.hello()
    client.send_raw(frame.decode())
    client.expect_error("INVALID_MESSAGE")
    client.send("PING", "SYSTEM", {"nonce": "after"}, seq="50")
    client.recv_type("PONG", nonce="after")


def test_max_json_depth_is_configurable(make_server, make_client):
    server = make_server(maxJsonDepth=4)
    client = make_client(server, server.issue_token("alice"))
    client.hello()
    # the envelope is level 1, its payload 2, x 3, y 4
    client.send("PING", "SYSTEM", {"nonce": "n", "x": {"y": {"z": 1}}})
    client.recv_type("PONG")
    client.send("PING", "SYSTEM", {"nonce": "n", "x": {"y": {"z": {"w": 1}}}})  # level 5
    assert "deeper than 4" in client.expect_error("INVALID_MESSAGE")["payload"]["message"]


def test_array_body_with_an_element_nested_past_the_encoder_limit(server):
    """Was a 500: re-encoding the element for its byte count hit orjson's 254 levels."""
    client = SSEClient(server.base_url, server.issue_token("alice"))
    try:
        client.hello()
        body = b"[" + deep_envelope(300, 2) + b"]"
        resp = client.post(body)
        assert resp.status_code == 202
        client.expect_error("INVALID_MESSAGE")
    finally:
        client.close()


@pytest.mark.parametrize("path,headers", [
    ("/proto/sse?token={t}&session=s&last_seq=" + "9" * 5000, {}),
    ("/proto/sse?token={t}&session=s&last_seq=%C2%B2", {}),  # '²' is a digit to isdigit()
    ("/proto/sse?token={t}", {"Last-Event-ID": "s:" + "9" * 5000}),
    ("/proto/websocket?token={t}&session=s&last_seq=" + "9" * 3000, UPGRADE_HEADERS),
], ids=["sse-last_seq-5000", "sse-superscript", "last-event-id-5000", "ws-last_seq-3000"])
def test_malformed_seq_arguments_are_400(server, path, headers):
    status, _, body = request(server.base_url, "GET",
                              path.format(t=server.issue_token("alice")), headers)
    assert (status, error_code(body)) == (400, "INVALID_MESSAGE"), body


@pytest.mark.parametrize("endpoint", sorted(endpoints()))
def test_a_query_string_that_is_not_utf8_is_400(shared_server, endpoint):
    """Was a 500 on every transport: werkzeug's request.args raises UnicodeDecodeError."""
    method, path, body = endpoints()[endpoint]
    token = shared_server.issue_token("alice").encode()
    raw_path = path.encode() + (b"&" if b"?" in path.encode() else b"?") + \
        b"token=" + token[:20] + b"\xb9" + token[20:]
    head = b"%s %s HTTP/1.1\r\nHost: x\r\n" % (method.encode(), raw_path)
    if endpoint == "websocket":
        head += b"".join(b"%s: %s\r\n" % (k.encode(), v.encode())
                         for k, v in UPGRADE_HEADERS.items())
    if body is not None:
        head += b"Content-Length: %d\r\n" % len(body)
    response = raw_exchange(shared_server.base_url, head + b"\r\n" + (body or b""))
    assert status_of(response) == 400, response[:300]
    assert b"INVALID_MESSAGE" in response


def test_stream_resume_with_a_huge_last_seq_is_400(server):
    token = server.issue_token("alice")
    status, _, body = request(server.base_url, "POST",
                              "/proto/stream?session=s&last_seq=" + "9" * 5000,
                              {"Authorization": f"Bearer {token}"}, orjson.dumps(HELLO))
    assert (status, error_code(body)) == (400, "INVALID_MESSAGE"), body


# -- the WebSocket upgrade's Host header ---------------------------------------------------------


@pytest.mark.parametrize("host_lines", [
    "", "Host: \r\n", "Host: [::::bogus\r\n", "Host: a b\r\n", "Host: a\r\nHost: b\r\n",
    "Host: \xff\xfe\r\n", "Host: x:99999999999\r\n", "Host: http://x/\r\n",
], ids=["missing", "empty", "bad-ipv6", "space", "twice", "latin1", "long-port", "url"])
def test_upgrade_with_a_bogus_host_is_refused(server, host_lines):
    token = server.issue_token("alice")
    raw = (f"GET /proto/websocket?token={token} HTTP/1.1\r\n{host_lines}"
           + "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items()) + "\r\n")
    response = raw_exchange(server.base_url, raw.encode("latin-1"))
    assert status_of(response) == 400, response[:200]
    if b"application/json" in response:
        assert b"INVALID_MESSAGE" in response
    assert server.get_stats()["activeConnections"] == 0
    assert requests.get(server.base_url + "/health", timeout=timeout(5)).status_code == 200


def test_upgrade_with_a_normal_host_still_works(server):
    for host in ("localhost", "127.0.0.1:8080", "[::1]:443", "api.example.com"):
        token = server.issue_token("alice")
        raw = (f"GET /proto/websocket?token={token} HTTP/1.1\r\nHost: {host}\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items()) + "\r\n")
        assert status_of(raw_exchange(server.base_url, raw.encode(), wait=1)) == 101


# -- the embedded server's own error path -------------------------------------------------------


def test_an_exception_in_a_view_is_logged_once_not_forever():
    """The embedded server's Flask app logger is protoflask's; Flask's default handler on it
    wrote into wsgi.errors, which logged to protoflask again, until RecursionError (the
    client then got gevent's bare text/plain 500 instead of Flask's)."""
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})

    @server.app.get("/boom")
    def boom():
        raise RuntimeError("boom")

    server.start()
    try:
        resp = requests.get(f"http://127.0.0.1:{server.port}/boom", timeout=timeout(5))
        assert resp.status_code == 500
        # Flask's own error path (not gevent's bare text/plain 500): the JSON error body
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.json()["error"]["code"] == "INTERNAL_ERROR"
        assert "boom" not in resp.text  # the exception stays in the log
    finally:
        server.stop()


def test_stream_clients_see_rate_limits_too(make_server):
    """The duplex stream reads its body in its own greenlet: a flood there is limited and
    the response ends (the NDJSON stream's close)."""
    server = make_server(rateLimit=1, rateLimitBurst=2)
    client = StreamClient(server.base_url, server.issue_token("alice"))
    try:
        client.hello()
        client.send_chunk(b"".join(orjson.dumps(envelope("PING", payload={"nonce": str(i)},
                                                         seq=5 + i)) + b"\n"
                                   for i in range(10)))
        client.expect_error("RATE_LIMITED")
        client.wait_ended()
    finally:
        client.close()
