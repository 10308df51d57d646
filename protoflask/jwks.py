"""Public keys for asymmetric tokens: PEM keys from the configuration and an identity
provider's JWKS, fetched only from the configured URL (docs/PROTOCOL.md §1.1 Authentication).

Each key accepts only the algorithms of its own type, so a token can never pick how it is
checked: RSA keys RS256/384/512 and PS256/384/512, an EC key the one ES algorithm of its
curve, Ed25519/Ed448 keys EdDSA; a JWK that names its `alg` accepts only that one. A key
is never used as an HMAC secret.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import gevent
import jwt
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

log = logging.getLogger("protoflask.auth")

RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512",
                 "secp256k1": "ES256K"}
ASYMMETRIC_ALGORITHMS = RSA_ALGORITHMS | frozenset(EC_ALGORITHMS.values()) | {"EdDSA"}

#: A JWKS document larger than this is refused (a key set is a few kB).
MAX_JWKS_BYTES = 1 << 20
#: Seconds one fetch of the key set may take in all (connect, head, body): an endpoint
#: that trickles is given up on then, and the next refresh may start.
FETCH_TIMEOUT = 5.0
#: Keys older than this are fetched again on the next token, so a key the provider
#: withdrew stops being accepted within this time even when no unknown kid shows up.
MAX_KEY_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class PublicKey:
    key: Any  # a cryptography public key object
    algorithms: frozenset[str]
    kid: str | None = None


def algorithms_for(key: Any) -> frozenset[str]:
    """The algorithms a public key of this type may verify (empty: not a usable key)."""
    if isinstance(key, rsa.RSAPublicKey):
        return RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = EC_ALGORITHMS.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return frozenset({"EdDSA"})
    return frozenset()


def load_pem_keys(text: str) -> list[PublicKey]:
    """Every public key (or certificate's key) in PEM text; ValueError for anything else,
    a private key included (give the server only the public half)."""
    blocks = ["-----BEGIN" + b for b in text.split("-----BEGIN")[1:]]
    if not blocks:
        raise ValueError("no PEM block (-----BEGIN PUBLIC KEY-----) found")
    keys = []
    for block in blocks:
        data = block.encode()
        if "PRIVATE KEY" in block.split("\n", 1)[0]:
            raise ValueError("jwtPublicKey holds a private key: give the server the public "
                             "key only")
        if "CERTIFICATE" in block.split("\n", 1)[0]:
            key: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
        algorithms = algorithms_for(key)
        if not algorithms:
            raise ValueError(f"unsupported public key type {type(key).__name__}")
        keys.append(PublicKey(key, algorithms))
    return keys


def keys_from_jwks(document: Any) -> list[PublicKey]:
    """The usable signing keys of a JWKS document; keys it cannot use are skipped."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("a JWKS document is an object with a 'keys' list")
    keys = []
    for jwk in document["keys"]:
        if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig" or jwk.get("kty") == "oct":
            continue  # encryption keys and shared secrets are never signing keys here
        try:
            key = jwt.PyJWK(jwk).key
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
            log.warning("JWKS: skipping key %r: %s", jwk.get("kid"), exc)
            continue
        algorithms = algorithms_for(key)
        named = jwk.get("alg")
        if isinstance(named, str):
            algorithms &= {named}
        if algorithms:
            kid = jwk.get("kid")
            keys.append(PublicKey(key, frozenset(algorithms),
                                  kid if isinstance(kid, str) else None))
    return keys


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """The key set is fetched from the configured URL only: a redirect is a failed fetch
    (an identity provider whose URL moved is configured with its new URL), so nobody who
    can answer that URL can send the server to fetch from anywhere else."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code,
                                     f"JWKS redirects are not followed (to {newurl})",
                                     headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects)


def fetch_json(url: str, deadline: float = FETCH_TIMEOUT,
               clock: Callable[[], float] = time.monotonic) -> Any:
    """The JSON document at ``url``, read whole within ``deadline`` seconds in total
    (connecting, the head and every byte of the body), or an exception. A per-read
    timeout alone let an endpoint that sends a byte every few seconds hold the fetch
    (and the refresh) for as long as it trickled."""
    ends = clock() + deadline
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with _OPENER.open(request, timeout=deadline) as response:
        body = b""
        while len(body) <= MAX_JWKS_BYTES:
            left = ends - clock()
            if left <= 0:
                raise TimeoutError(f"JWKS not read within {deadline} s")
            sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
            if sock is not None:
                sock.settimeout(left)
            piece = response.read1(65536)
            if not piece:
                break
            body += piece
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
    return orjson.loads(body)


class JWKSCache:
    """An identity provider's keys, fetched from one configured URL.

    Fetched on first use, again when the keys are older than ``MAX_KEY_AGE``, and when a
    token names a kid the cache does not know, but never more often than once per
    ``refresh_interval`` seconds: a flood of made-up kids costs the provider one request
    per interval. A failed fetch keeps the keys it had (the last good set). A fetch takes
    at most ``FETCH_TIMEOUT`` seconds in all and follows no redirect (``fetch_json``)."""

    def __init__(self, url: str, refresh_interval: float,
                 fetch: Callable[[str], Any] = fetch_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.refresh_interval = refresh_interval
        self._fetch = fetch
        self._clock = clock
        self._keys: list[PublicKey] = []
        self._fetched_at: float | None = None  # last successful fetch
        self._tried_at: float | None = None  # last attempt
        self._fetching = False

    def keys(self, kid: str | None = None) -> list[PublicKey]:
        """The current keys; refreshed first when stale, or when ``kid`` is unknown."""
        now = self._clock()
        stale = self._fetched_at is None or now - self._fetched_at >= MAX_KEY_AGE
        unknown = kid is not None and all(k.kid != kid for k in self._keys)
        if (stale or unknown) and self._may_try(now):
            self._refresh(now)
        return self._keys

    def _may_try(self, now: float) -> bool:
        # a fetch still under way past its deadline (it could not be cut short) no
        # longer holds the refresh back
        busy = self._fetching and self._tried_at is not None \
            and now - self._tried_at < FETCH_TIMEOUT
        return not busy and (
            self._tried_at is None or now - self._tried_at >= self.refresh_interval)

    def _refresh(self, now: float) -> None:
        self._fetching, self._tried_at = True, now
        try:
            # in a thread of the hub's pool: the worker's other greenlets run meanwhile,
            # whether or not the process is monkey-patched
            outcome = gevent.get_hub().threadpool.apply(_outcome, (self._fetch, self.url))
            if isinstance(outcome, BaseException):
                raise outcome
            keys = keys_from_jwks(outcome)
        except Exception as exc:  # the provider is down or answered nonsense
            log.warning("JWKS: cannot fetch %s: %s (keeping %d keys)", self.url, exc,
                        len(self._keys))
            return
        finally:
            self._fetching = False
        self._keys, self._fetched_at = keys, now


def _outcome(fetch: Callable[[str], Any], url: str) -> Any:
    """What ``fetch(url)`` returns, or the exception it raised (handed back to the
    greenlet to raise, not printed by the thread pool as a crash)."""
    try:
        return fetch(url)
    except Exception as exc:  # noqa: BLE001 - handed back to the caller
        return exc


def candidates(keys: Iterable[PublicKey], alg: str, kid: str | None) -> list[PublicKey]:
    """The keys that may check a token with header ``alg``/``kid``: the key with that kid
    first, then keys without a kid (PEM keys); none for an algorithm no key allows."""
    usable = [k for k in keys if alg in k.algorithms]
    exact = [k for k in usable if kid is not None and k.kid == kid]
    loose = [k for k in usable if k.kid is None or kid is None]
    return exact + loose  # disjoint: a loose key has no kid, or the token names none


def load_public_keys(value: str) -> list[PublicKey]:
    """jwtPublicKey: PEM text, or the path of a PEM file."""
    if "-----BEGIN" not in value:
        with open(value, encoding="ascii") as fh:
            value = fh.read()
    return load_pem_keys(value)
