"""JWT verification and issuing (docs/PROTOCOL.md §1.1 Authentication)."""

from __future__ import annotations

import time

import jwt
import pytest

from protoflask.auth import TokenAuthority, parse_duration, token_from_request
from protoflask.core.errors import InvalidToken, MissingToken

from .support import SECRET

LONG_SECRET = "a-secret-of-at-least-sixty-four-bytes-so-that-hs512-is-happy-too!!"


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(SECRET)


def sign(claims: dict, key: str = SECRET, algorithm: str = "HS256") -> str:
    """``claims`` signed, with an exp a minute ahead unless they say otherwise."""
    claims = {"exp": int(time.time()) + 60, **claims}
    if claims["exp"] is None:  # exp: None signs a token without exp
        del claims["exp"]
    return jwt.encode(claims, key, algorithm=algorithm)


def test_hs256_token_verifies(authority: TokenAuthority) -> None:
    assert authority.verify(sign({"sub": "alice", "exp": int(time.time()) + 60})) == "alice"


def test_a_token_without_exp_is_refused_by_default(authority: TokenAuthority) -> None:
    """Issue 13 item 8: a token without exp would never expire (jwtRequireExp)."""
    with pytest.raises(InvalidToken, match="exp"):
        authority.verify(sign({"sub": "alice", "exp": None}))
    lax = TokenAuthority(SECRET, require_exp=False)
    assert lax.verify(sign({"sub": "alice", "exp": None})) == "alice"
    with pytest.raises(InvalidToken, match="expired"):  # an exp present is still checked
        lax.verify(sign({"sub": "alice", "exp": int(time.time()) - 10}))


def test_issued_tokens_always_carry_exp(authority: TokenAuthority) -> None:
    for lifetime in (None, "30s", 7):
        claims = jwt.decode(authority.issue("alice", lifetime), SECRET, algorithms=["HS256"])
        assert claims["exp"] > claims["iat"]


@pytest.mark.parametrize("claims,user", [
    ({"sub": "s", "userId": "u", "user_id": "x"}, "s"),
    ({"userId": "u", "user_id": "x"}, "u"),
    ({"user_id": "x"}, "x"),
    ({"user_id": 42}, "42"),
])
def test_user_claim_order(authority: TokenAuthority, claims: dict, user: str) -> None:
    assert authority.verify(sign(claims)) == user


@pytest.mark.parametrize("claims", [{}, {"name": "alice"}, {"sub": ""}, {"userId": None}])
def test_token_without_user_claim_is_invalid(authority: TokenAuthority, claims: dict) -> None:
    with pytest.raises(InvalidToken) as info:
        authority.verify(sign(claims))
    assert info.value.code == "INVALID_TOKEN"


def test_a_remembered_token_still_expires(authority: TokenAuthority,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified HMAC token is remembered (the HTTP transports send it with every POST)
    but its exp is checked on every use, as PyJWT would (expired once exp <= now)."""
    exp = int(time.time()) + 60
    token = sign({"sub": "alice", "exp": exp})
    assert authority.verify(token) == "alice"
    assert authority.verify(token) == "alice"  # from the cache
    monkeypatch.setattr(time, "time", lambda: exp - 0.001)
    assert authority.verify(token) == "alice"
    monkeypatch.setattr(time, "time", lambda: float(exp))
    with pytest.raises(InvalidToken, match="expired"):
        authority.verify(token)


def test_a_tampered_copy_of_a_remembered_token_is_refused(authority: TokenAuthority) -> None:
    token = sign({"sub": "alice"})
    assert authority.verify(token) == "alice"
    head, body, sig = token.split(".")
    with pytest.raises(InvalidToken):
        authority.verify(f"{head}.{body}.{sig[:-2]}AA")


def test_expired_token_is_invalid(authority: TokenAuthority) -> None:
    token = sign({"sub": "alice", "exp": int(time.time()) - 5})
    with pytest.raises(InvalidToken) as info:
        authority.verify(token)
    assert info.value.code == "INVALID_TOKEN"
    assert "expired" in info.value.message


def test_wrong_key_is_invalid(authority: TokenAuthority) -> None:
    with pytest.raises(InvalidToken):
        authority.verify(sign({"sub": "alice"}, key="another-secret-long-enough-for-hs256!!"))


def test_garbage_token_is_invalid(authority: TokenAuthority) -> None:
    for token in ("not-a-jwt", "a.b.c", sign({"sub": "alice"})[:-4] + "AAAA"):
        with pytest.raises(InvalidToken):
            authority.verify(token)


def test_alg_none_is_refused() -> None:
    token = jwt.encode({"sub": "alice"}, None, algorithm="none")
    assert jwt.get_unverified_header(token)["alg"] == "none"
    with pytest.raises(InvalidToken):
        TokenAuthority(SECRET).verify(token)
    # even an authority told to accept "none" drops it
    lax = TokenAuthority(SECRET, algorithms=["HS256", "none"])
    assert lax.algorithms == ["HS256"]
    with pytest.raises(InvalidToken):
        lax.verify(token)


def test_algorithm_not_in_jwt_algorithms_is_refused() -> None:
    token = sign({"sub": "alice"}, key=LONG_SECRET, algorithm="HS512")
    with pytest.raises(InvalidToken):
        TokenAuthority(LONG_SECRET, algorithms=["HS256"]).verify(token)
    # the same token is fine where HS512 is pinned
    assert TokenAuthority(LONG_SECRET, algorithms=["HS512"]).verify(token) == "alice"


def test_issue_uses_the_first_pinned_algorithm() -> None:
    authority = TokenAuthority(LONG_SECRET, algorithms=["HS512", "HS256"])
    token = authority.issue("bob")
    assert jwt.get_unverified_header(token)["alg"] == "HS512"
    assert authority.verify(token) == "bob"


@pytest.mark.parametrize("token", [None, ""])
def test_missing_token(authority: TokenAuthority, token) -> None:
    with pytest.raises(MissingToken) as info:
        authority.verify(token)
    assert info.value.code == "MISSING_TOKEN"
    assert info.value.http_status == 401


@pytest.mark.parametrize("expires_in,seconds", [
    ("30s", 30), ("15m", 900), ("24h", 86400), ("7d", 604800), (120, 120), ("120", 120),
])
def test_issue_token_lifetimes(expires_in, seconds) -> None:
    authority = TokenAuthority(SECRET, expires_in=expires_in)
    before = int(time.time())
    token = authority.issue("carol")
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "carol"
    assert claims["exp"] - claims["iat"] == seconds
    assert before <= claims["iat"] <= int(time.time())
    assert authority.verify(token) == "carol"


def test_issue_token_default_lifetime_is_24h(authority: TokenAuthority) -> None:
    claims = jwt.decode(authority.issue("dave"), SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 86400


def test_issue_token_with_explicit_lifetime(authority: TokenAuthority) -> None:
    claims = jwt.decode(authority.issue("erin", "15m"), SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 900


def test_issued_token_expires() -> None:
    authority = TokenAuthority(SECRET)
    now = int(time.time())
    token = sign({"sub": "frank", "iat": now - 100, "exp": now - 1})
    with pytest.raises(InvalidToken):
        authority.verify(token)


@pytest.mark.parametrize("bad", ["soon", "0", "-5", "10w", "", 0, -3, True])
def test_bad_durations(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_token_from_request() -> None:
    assert token_from_request("q", None) == "q"
    assert token_from_request(None, "Bearer abc") == "abc"
    assert token_from_request(None, "bearer   abc ") == "abc"
    assert token_from_request("q", "Bearer abc") == "q"  # the query wins when both exist
    assert token_from_request("", "Bearer abc") == "abc"
    assert token_from_request(None, "Basic dXNlcjpwYXNz") is None
    assert token_from_request(None, "Bearer ") is None
    assert token_from_request(None, "abc") is None
    assert token_from_request(None, None) is None
