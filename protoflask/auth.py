"""JWT verification and issuing with PyJWT (docs/PROTOCOL.md §1.1 Authentication)."""

from __future__ import annotations

import binascii
import hmac
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable

import jwt
import orjson
from jwt.warnings import InsecureKeyLengthWarning

from .core.errors import InvalidToken, MissingToken
from .jwks import ASYMMETRIC_ALGORITHMS, JWKSCache, PublicKey, candidates, load_public_keys
from .options import parse_duration

if TYPE_CHECKING:
    from .config import ServerConfig

#: An HS256 secret shorter than this can be guessed offline from one token (RFC 7518
#: §3.2 asks for at least the hash size). The server and `protoflask token` say so in
#: one plain sentence (weak_secret_warning) instead of PyJWT's warning with its path.
MIN_SECRET_BYTES = 32
warnings.filterwarnings("ignore", category=InsecureKeyLengthWarning)


def weak_secret_warning(secret: str | None) -> str | None:
    """The warning for a secret too short for HS256, or None."""
    size = len(secret.encode()) if secret else 0
    if not secret or size >= MIN_SECRET_BYTES:
        return None
    return (f"the JWT secret is only {size} bytes: anyone holding one token can guess it "
            f"and sign tokens for any user; use at least {MIN_SECRET_BYTES} random bytes, "
            "e.g. JWT_SECRET=$(openssl rand -hex 32)")


USER_CLAIMS = ("sub", "userId", "user_id")
#: HMAC tokens remembered once verified, until their exp: each POST of the HTTP
#: transports carries its token again (verifying it costs ~10% of a 50-message body) and
#: a reconnect storm brings every user's token back at once (docs/PERFORMANCE.md,
#: "p7-storm"). Bounded: when full, the oldest half is forgotten (~150 B a token).
VERIFIED_CACHE_SIZE = 65536
#: JWT header segments whose check ``_hs256_claims`` remembers (a server sees one or two:
#: its issuer's); past this many, new ones are checked every time
HEADERS_KEPT = 64
#: the base64url alphabet's two letters as the standard alphabet's (urlsafe_b64decode's)
_URLSAFE = bytes.maketrans(b"-_", b"+/")
#: the JWT headers of the common HS256 token
_HS256_HEADERS = ({"alg": "HS256", "typ": "JWT"}, {"alg": "HS256"})


class TokenAuthority:
    """Verifies tokens (HMAC with ``secret``; RS/PS/ES/EdDSA with ``public_keys`` and a
    ``jwks`` cache) and issues the server's own (HMAC only)."""

    def __init__(self, secret: str | None, algorithms: Iterable[str] = ("HS256",),
                 expires_in: str | int = "24h", *, public_keys: Iterable[PublicKey] = (),
                 jwks: JWKSCache | None = None, audience: str | None = None,
                 issuer: str | None = None, require_exp: bool = True) -> None:
        self._secret = secret
        self.require_exp = require_exp  # a token without exp would never expire
        self.algorithms = [a for a in algorithms if a.lower() != "none"]
        #: HMAC algorithms accepted with the secret (never with a public key)
        self._hmac = {a for a in self.algorithms if a.startswith("HS")} if secret else set()
        #: asymmetric algorithms named in jwtAlgorithms narrow what every key accepts;
        #: none named: each key accepts its own type's algorithms
        self._pinned = {a for a in self.algorithms if a in ASYMMETRIC_ALGORITHMS} or None
        self._public_keys = list(public_keys)
        self._jwks = jwks
        self.audience, self.issuer = audience, issuer
        self.expires_in = parse_duration(expires_in)
        #: An HMAC-signed token's signature -> (hash of the whole token, user id, exp or
        #: None): the same string always verifies the same way with the same secret, so
        #: only its expiry is checked again. Tokens checked with public keys are not kept
        #: (a key may leave the JWKS: the token is then refused).
        self._verified: dict[str, tuple[int, str, float | None]] = {}
        #: the swap point of HS256 verification: PyJWT (``_decode``) or ``hs256_claims``
        #: for the common token, which defers to PyJWT for anything else
        self.fast_hs256: Callable[[str], dict[str, Any] | None] | None = (
            self._hs256_claims if "HS256" in self._hmac and audience is None
            and issuer is None and _hmac_key_ok(secret) else None)
        #: a header segment -> whether it is the common HS256 token's (``_hs256_claims``:
        #: the same string always decodes the same way)
        self._headers: dict[str, bool] = {}
        self._key = secret.encode() if secret else b""
        #: HMAC-SHA256 keyed once (its inner and outer pads hashed), copied per token
        #: (``_signature``)
        self._keyed: Any = _keyed_sha256(self._key) if self.fast_hs256 is not None else None

    #: The swap point of ``_hs256_claims``' HMAC: a copy of the state keyed once (no key
    #: pads hashed and no digest looked up per token: ~10k instructions a token), or with
    #: False ``hmac.digest``, OpenSSL's one-shot; the same bytes either way
    #: (tests/test_auth_storm.py runs its cases both ways)
    keyed_hmac = True

    def _signature(self, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` with the secret."""
        keyed = self._keyed
        if keyed is None or not self.keyed_hmac:
            return hmac.digest(self._key, message, "sha256")
        mac = keyed.copy()
        mac.update(message)
        return bytes(mac.digest())

    @property
    def can_issue(self) -> bool:
        return bool(self._secret) and bool(self._hmac)

    def verify(self, token: str | None) -> str:
        """The token's user id, or MissingToken / InvalidToken."""
        return self.verify_with_expiry(token)[0]

    def verify_with_expiry(self, token: str | None) -> tuple[str, float | None]:
        """The token's user id and its ``exp`` (seconds since the epoch; None: none), or
        MissingToken / InvalidToken. What a connect ticket needs: never to outlive it."""
        if not token:
            raise MissingToken()
        signature = token[token.rfind(".") + 1:]
        known = self._verified.get(signature)
        if known is not None and known[0] == hash(token):
            if known[2] is None or time.time() < known[2]:  # PyJWT: expired once exp <= now
                return known[1], known[2]
            del self._verified[signature]
            raise InvalidToken("token expired")
        claims = self.fast_hs256(token) if self.fast_hs256 is not None else None
        alg: Any = "HS256"
        if claims is None:  # not the common case: PyJWT decides, and words the refusal
            try:
                header = jwt.get_unverified_header(token)
            except jwt.PyJWTError as exc:
                raise InvalidToken(f"invalid token: {exc}") from None
            alg, kid = header.get("alg"), header.get("kid")
            if not isinstance(alg, str) or not isinstance(kid, (str, type(None))):
                raise InvalidToken("invalid token: bad header")
            claims = self._decode(token, alg, kid)
        for claim in USER_CLAIMS:
            value = claims.get(claim)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                exp = claims.get("exp")
                if alg in self._hmac:
                    self._remember(token, str(value), exp)
                return str(value), _seconds(exp)
        raise InvalidToken("token has no user claim (sub, userId or user_id)")

    def _remember(self, token: str, user: str, exp: Any) -> None:
        if exp is not None and not isinstance(exp, (int, float)):
            return  # PyJWT accepted it (a numeric string?): leave it to PyJWT every time
        verified = self._verified
        if len(verified) >= VERIFIED_CACHE_SIZE:  # forget the oldest half (insertion order)
            for old in list(verified)[:VERIFIED_CACHE_SIZE // 2]:
                del verified[old]
        verified[token[token.rfind(".") + 1:]] = (hash(token), user, exp)

    def _hs256_claims(self, token: str) -> dict[str, Any] | None:
        """The claims of a common HS256 token, checked as ``_decode`` checks them, or None
        to leave the token to PyJWT (anything else, and every refusal, so that its
        wording stays PyJWT's). Common: header ``{"alg":"HS256"}`` with at most ``typ``
        JWT, a valid signature, an integer ``exp`` in the future (or none, when not
        required), an integer ``iat`` and ``nbf`` if present, ``nbf`` not in the future,
        no ``aud``. Held equal to PyJWT by tests/test_auth.py ``TestFastHs256``."""
        try:
            head, body, sig = token.split(".")
            common = self._headers.get(head)
            if common is None:
                common = orjson.loads(_b64(head)) in _HS256_HEADERS
                if len(self._headers) < HEADERS_KEPT:
                    self._headers[head] = common
            if not common:
                return None
            # the bytes of hmac.new(...).digest()
            mac = self._signature(f"{head}.{body}".encode())
            if not hmac.compare_digest(mac, _b64(sig)):
                return None
            claims = orjson.loads(_b64(body))
        except (ValueError, binascii.Error, UnicodeError, orjson.JSONDecodeError):
            return None
        if not isinstance(claims, dict) or "aud" in claims \
                or not isinstance(claims.get("sub", ""), str) \
                or not isinstance(claims.get("jti", ""), str):
            return None  # PyJWT checks aud, refuses a sub or jti that is not a string
        now = time.time()
        exp, iat, nbf = claims.get("exp"), claims.get("iat"), claims.get("nbf")
        if exp is None and self.require_exp and "exp" not in claims:
            return None
        for value in (exp, iat, nbf):
            if value is not None and (type(value) is not int):
                return None
        if ("exp" in claims and (exp is None or exp <= now)) or (
                "iat" in claims and iat is None) or ("nbf" in claims and (nbf is None
                                                                        or nbf > now)):
            return None
        if iat is not None and iat > now:  # PyJWT refuses an iat in the future
            return None
        return claims

    def _decode(self, token: str, alg: str, kid: str | None) -> dict[str, Any]:
        keys: list[Any]
        if alg in self._hmac:
            keys = [self._secret]
        elif alg in ASYMMETRIC_ALGORITHMS and (self._pinned is None or alg in self._pinned):
            known = self._public_keys + (self._jwks.keys(kid) if self._jwks else [])
            keys = [k.key for k in candidates(known, alg, kid)]
            if not keys:
                raise InvalidToken(f"invalid token: no key for alg {alg!r}"
                                   + (f" and kid {kid!r}" if kid else ""))
        else:
            raise InvalidToken(f"invalid token: algorithm {alg!r} is not accepted")
        error: jwt.PyJWTError | None = None
        for key in keys:  # a token without kid may match any of a few keys
            try:
                return jwt.decode(token, key, algorithms=[alg], audience=self.audience,
                                  issuer=self.issuer,
                                  options={"require": ["exp"] if self.require_exp else [],
                                           "verify_exp": True,
                                           "verify_aud": self.audience is not None})
            except jwt.InvalidSignatureError as exc:
                error = exc
            except jwt.ExpiredSignatureError:
                raise InvalidToken("token expired") from None
            except jwt.MissingRequiredClaimError as exc:
                if exc.claim == "exp":
                    raise InvalidToken("token has no exp claim (jwtRequireExp)") from None
                raise InvalidToken(f"invalid token: {exc}") from None
            except jwt.PyJWTError as exc:
                raise InvalidToken(f"invalid token: {exc}") from None
        raise InvalidToken(f"invalid token: {error}")

    def issue(self, user_id: str, expires_in: str | int | None = None,
              **claims: Any) -> str:
        if not self.can_issue:
            raise RuntimeError("issuing tokens needs jwtSecret (and an HS algorithm in "
                               "jwtAlgorithms); this server only verifies tokens signed by "
                               "its identity provider")
        now = int(time.time())
        lifetime = self.expires_in if expires_in is None else parse_duration(expires_in)
        payload = {"sub": str(user_id), "iat": now, "exp": now + lifetime, **claims}
        algorithm = next(a for a in self.algorithms if a in self._hmac)
        assert self._secret is not None  # can_issue
        return jwt.encode(payload, self._secret, algorithm=algorithm)




def _hmac_key_ok(secret: str | None) -> bool:
    """Whether PyJWT takes ``secret`` as an HMAC key (it refuses one that looks like a
    public key): the fast check must refuse what PyJWT refuses."""
    try:
        jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256).prepare_key(
            secret or "")
    except jwt.PyJWTError:
        return False
    return bool(secret)


def _keyed_sha256(key: bytes) -> Any:
    """An HMAC-SHA256 object keyed with ``key``, to be copied: OpenSSL's own (``_hashlib``,
    what ``hmac.new`` wraps) where there is one, else ``hmac.new``'s."""
    try:
        from _hashlib import hmac_new
    except ImportError:  # pragma: no cover - a Python without OpenSSL's HMAC
        return hmac.new(key, digestmod="sha256")
    return hmac_new(key, digestmod="sha256")


def _b64(segment: str) -> bytes:
    """A base64url segment of a JWT (unpadded), as PyJWT decodes it: what
    ``base64.urlsafe_b64decode`` answers, its steps inline (a non-ASCII segment raises
    UnicodeEncodeError, a ValueError as base64's; held equal by tests/test_auth_storm.py)."""
    padded = segment + "=" * (-len(segment) % 4)
    return binascii.a2b_base64(padded.encode("ascii").translate(_URLSAFE))


def _seconds(exp: Any) -> float | None:
    """A verified token's ``exp`` as a number (PyJWT accepted it, so int() reads it)."""
    if exp is None:
        return None
    try:
        return float(int(exp))
    except (TypeError, ValueError, OverflowError):
        return None


def authority_from_config(config: "ServerConfig") -> TokenAuthority:
    """The TokenAuthority a server's configuration describes."""
    jwks = None
    if config.jwks_url:
        jwks = JWKSCache(config.jwks_url, config.jwks_refresh_interval / 1000)
    public = load_public_keys(config.jwt_public_key) if config.jwt_public_key else []
    return TokenAuthority(config.jwt_secret, config.jwt_algorithms, config.jwt_expires_in,
                          public_keys=public, jwks=jwks, audience=config.jwt_audience,
                          issuer=config.jwt_issuer, require_exp=config.jwt_require_exp)


def token_from_request(query_token: str | None, authorization: str | None) -> str | None:
    """The token from ``?token=`` or ``Authorization: Bearer``, whichever is present."""
    if query_token:
        return query_token
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None
