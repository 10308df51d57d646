"""JWKSCache on plain data: a fake fetch and a fake clock (the live JWKS server is in
tests/integration/test_identity_provider.py)."""

from __future__ import annotations

import json

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from protoflask.jwks import MAX_KEY_AGE, JWKSCache, candidates, keys_from_jwks

EC = ec.generate_private_key(ec.SECP256R1())
RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key, kid: str, **extra) -> dict:
    alg = "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"
    out = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
    return {**out, "kid": kid, **extra}


class Provider:
    def __init__(self, *keys: dict) -> None:
        self.doc = {"keys": list(keys)}
        self.calls = 0
        self.fail = False

    def __call__(self, url: str) -> dict:
        self.calls += 1
        if self.fail:
            raise OSError("connection refused")
        return self.doc


def test_refreshes_on_unknown_kid_at_most_once_per_interval() -> None:
    now = [0.0]
    idp = Provider(jwk(EC, "a"))
    cache = JWKSCache("https://idp/jwks", 10.0, fetch=idp, clock=lambda: now[0])
    assert [k.kid for k in cache.keys("a")] == ["a"] and idp.calls == 1
    for kid in ("x", "y", "z"):
        cache.keys(kid)
    assert idp.calls == 1  # the first fetch was less than 10 s ago
    now[0] = 10.0
    idp.doc["keys"].append(jwk(RSA, "b"))
    assert {k.kid for k in cache.keys("b")} == {"a", "b"} and idp.calls == 2
    assert cache.keys("b") and idp.calls == 2  # known kid: no fetch


def test_old_keys_are_fetched_again_and_a_failure_keeps_them() -> None:
    now = [0.0]
    idp = Provider(jwk(EC, "a"))
    cache = JWKSCache("https://idp/jwks", 1.0, fetch=idp, clock=lambda: now[0])
    cache.keys()
    now[0] = MAX_KEY_AGE
    idp.fail = True
    assert [k.kid for k in cache.keys()] == ["a"] and idp.calls == 2
    assert cache.keys() and idp.calls == 2  # the failed try counts against the interval
    now[0] += 1.0
    idp.fail = False
    idp.doc["keys"] = [jwk(RSA, "b")]
    assert [k.kid for k in cache.keys()] == ["b"] and idp.calls == 3


def test_only_signing_keys_with_their_own_algorithms() -> None:
    keys = keys_from_jwks({"keys": [
        jwk(EC, "enc", use="enc"), {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "RSA", "kid": "broken"}, jwk(RSA, "r", alg="PS256"), jwk(EC, "e"), "junk"]})
    assert {k.kid: sorted(k.algorithms) for k in keys} == {"r": ["PS256"], "e": ["ES256"]}
    assert [k.kid for k in candidates(keys, "ES256", "e")] == ["e"]
    assert candidates(keys, "RS256", "r") == []  # the JWK named PS256 only
    assert candidates(keys, "HS256", None) == []
