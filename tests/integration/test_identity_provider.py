"""Tokens from an identity provider: RS/PS/ES/EdDSA signatures checked with a configured PEM
key or the provider's JWKS, served here by a real local HTTP server that counts requests."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from websockets.exceptions import InvalidStatus

from protoflask import ConfigError, ProtoServer

from ..support import WSClient, wait_for


class KeyServer:
    """A JWKS endpoint on a free port; ``keys`` can change while it runs."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.requests = 0
        self.down = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                if owner.down:
                    self.send_error(503)
                    return
                body = json.dumps({"keys": owner.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/.well-known/jwks.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def publish(self, key: Any, kid: str, alg: str | None = None) -> None:
        jwk = json.loads(jwt.algorithms.get_default_algorithms()[
            "EdDSA" if isinstance(key, ed25519.Ed25519PrivateKey)
            else "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"
        ].to_jwk(key.public_key()))
        jwk["kid"] = kid
        if alg:
            jwk["alg"] = alg
        self.keys.append(jwk)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def idp() -> Iterator[KeyServer]:
    server = KeyServer()
    yield server
    server.close()


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()


def pem(key: Any) -> str:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def sign(key: Any, alg: str, kid: str | None = None, **claims: Any) -> str:
    body = {"sub": "alice", "exp": int(time.time()) + 300, **claims}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid} if kid else None)


def accepted(server: ProtoServer, token: str) -> bool:
    """True if a WebSocket with this token gets its HELLO answered; False on a 401."""
    try:
        client = WSClient(server.base_url, token)
    except InvalidStatus as exc:
        assert exc.response.status_code == 401
        return False
    try:
        return client.hello()["type"] == "HELLO"
    finally:
        client.close()


def test_rs256_es256_and_eddsa_tokens_from_the_providers_jwks(make_server, idp) -> None:
    idp.publish(RSA_KEY, "rsa-1")
    idp.publish(EC_KEY, "ec-1")
    idp.publish(ED_KEY, "ed-1")
    server = make_server(jwtSecret=None, jwksUrl=idp.url)
    assert accepted(server, sign(RSA_KEY, "RS256", "rsa-1"))
    assert accepted(server, sign(RSA_KEY, "PS256", "rsa-1"))  # same key type, pinned family
    assert accepted(server, sign(EC_KEY, "ES256", "ec-1"))
    assert accepted(server, sign(ED_KEY, "EdDSA", "ed-1"))
    assert idp.requests == 1  # fetched once, then cached
    # a key is checked only with its own type's algorithms, and only by its own kid
    assert not accepted(server, sign(EC_KEY, "ES256", "rsa-1"))
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert not accepted(server, sign(other, "RS256", "rsa-1"))
    assert not accepted(server, sign(RSA_KEY, "RS256", "rsa-1", exp=int(time.time()) - 10))


def test_a_jwk_that_names_its_alg_accepts_only_that_one(make_server, idp) -> None:
    idp.publish(RSA_KEY, "k", alg="RS256")
    server = make_server(jwtSecret=None, jwksUrl=idp.url)
    assert accepted(server, sign(RSA_KEY, "RS256", "k"))
    assert not accepted(server, sign(RSA_KEY, "PS256", "k"))


def test_algorithm_confusion_and_none_are_refused(make_server, idp) -> None:
    idp.publish(RSA_KEY, "k")
    server = make_server(jwtSecret=None, jwksUrl=idp.url, jwtPublicKey=pem(EC_KEY))
    public_pem = pem(RSA_KEY).encode()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k"}).encode())
    body = b64(json.dumps({"sub": "mallory", "exp": int(time.time()) + 60}).encode())
    # HS256 "signed" with the public key as the secret (PyJWT refuses to make one)
    mac = hmac.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    forged = f"{head}.{body}.{b64(mac)}"
    assert not accepted(server, forged)
    unsigned = f"{b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{body}."
    assert not accepted(server, unsigned)


def test_a_key_url_named_in_a_token_is_never_fetched(make_server, idp) -> None:
    attacker = KeyServer()
    try:
        attacker.publish(RSA_KEY, "evil")
        idp.publish(EC_KEY, "good")
        server = make_server(jwtSecret=None, jwksUrl=idp.url)
        token = jwt.encode({"sub": "mallory", "exp": int(time.time()) + 60}, RSA_KEY,
                           algorithm="RS256",
                           headers={"kid": "evil", "jku": attacker.url, "x5u": attacker.url})
        assert not accepted(server, token)
        assert attacker.requests == 0
    finally:
        attacker.close()


def test_unknown_kids_refresh_at_most_once_per_interval(make_server, idp) -> None:
    idp.publish(RSA_KEY, "old")
    server = make_server(jwtSecret=None, jwksUrl=idp.url)  # the default interval: 60 s
    assert accepted(server, sign(RSA_KEY, "RS256", "old"))
    for n in range(30):  # a flood of made-up kids
        assert not accepted(server, sign(RSA_KEY, "RS256", f"made-up-{n}"))
    assert idp.requests <= 2  # the first fetch, and at most one refresh in the interval


def test_a_rotated_key_is_picked_up_on_its_first_token(make_server, idp) -> None:
    idp.publish(RSA_KEY, "2026-11")
    server = make_server(jwtSecret=None, jwksUrl=idp.url, jwksRefreshInterval=200)
    assert accepted(server, sign(RSA_KEY, "RS256", "2026-11"))
    new_key = ec.generate_private_key(ec.SECP256R1())
    idp.publish(new_key, "2026-12")  # the provider rotates
    token = sign(new_key, "ES256", "2026-12")
    wait_for(lambda: accepted(server, token), what="the rotated key to be accepted")
    assert idp.requests <= 3


def test_a_provider_that_is_down_refuses_tokens_without_failing(make_server, idp) -> None:
    idp.publish(RSA_KEY, "k")
    idp.down = True
    server = make_server(jwtSecret=None, jwksUrl=idp.url, jwksRefreshInterval=200)
    token = sign(RSA_KEY, "RS256", "k")
    assert not accepted(server, token)  # 401, not a 500
    idp.down = False
    wait_for(lambda: accepted(server, token), what="the provider to be back")


def test_a_pem_key_inline_or_from_a_file(make_server, tmp_path) -> None:
    path = tmp_path / "idp.pem"
    path.write_text(pem(EC_KEY))
    for value in (pem(EC_KEY), str(path)):
        server = make_server(jwtSecret=None, jwtPublicKey=value)
        assert accepted(server, sign(EC_KEY, "ES256"))
        assert not accepted(server, sign(RSA_KEY, "RS256"))
        with pytest.raises(RuntimeError, match="jwtSecret"):
            server.issue_token("alice")  # no secret: this server only verifies


def test_audience_and_issuer_are_enforced_when_configured(make_server) -> None:
    server = make_server(jwtSecret=None, jwtPublicKey=pem(RSA_KEY), jwtAudience="my-app",
                         jwtIssuer="https://idp.example.com/")
    good = {"aud": "my-app", "iss": "https://idp.example.com/"}
    assert accepted(server, sign(RSA_KEY, "RS256", **good))
    assert not accepted(server, sign(RSA_KEY, "RS256", **{**good, "aud": "other-app"}))
    assert not accepted(server, sign(RSA_KEY, "RS256", **{**good, "iss": "https://evil/"}))
    assert not accepted(server, sign(RSA_KEY, "RS256"))  # neither claim


def test_hmac_and_provider_tokens_side_by_side(make_server, idp) -> None:
    idp.publish(RSA_KEY, "k")
    server = make_server(jwksUrl=idp.url)  # jwtSecret from make_server: HS256 too
    assert accepted(server, server.issue_token("alice"))
    assert accepted(server, sign(RSA_KEY, "RS256", "k"))


@pytest.mark.parametrize("config,message", [
    ({"jwtSecret": None}, "jwtSecret is required"),
    ({"jwtSecret": None, "jwtPublicKey": "-----BEGIN PUBLIC KEY-----\nnope\n"}, "jwtPublicKey"),
    ({"jwtSecret": None, "jwtPublicKey": RSA_KEY.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()}, "private key"),
    ({"jwtSecret": None, "jwksUrl": "ftp://idp.example.com/keys"}, "jwksUrl"),
])
def test_configuration_mistakes_fail_at_construction(config, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ProtoServer({"port": 0, **config})


@pytest.mark.parametrize("key,alg", [(RSA_KEY, "RS256"), (EC_KEY, "ES256"), (ED_KEY, "EdDSA")])
def test_the_token_command_signs_with_a_private_key(make_server, tmp_path, capsys, key,
                                                    alg) -> None:
    from protoflask.cli import main

    path = tmp_path / "private.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    assert main(["token", "--user", "bob", "--private-key", str(path), "--kid", "k1",
                 "--expires", "5m"]) == 0
    token = capsys.readouterr().out.strip()
    assert jwt.get_unverified_header(token) == {"alg": alg, "typ": "JWT", "kid": "k1"}
    server = make_server(jwtSecret=None, jwtPublicKey=pem(key))
    assert accepted(server, token)
    assert main(["token", "--user", "bob", "--private-key", str(path), "--alg", "HS256"]) == 2
