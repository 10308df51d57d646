"""What a reconnect storm leans on in token verification (issue 29): each distinct token
verified once, remembered by its signature until its exp within a bound, and the common
HS256 token checked by a fast path that PyJWT's answers hold equal."""

from __future__ import annotations

import base64
import hmac
import time
from typing import Callable

import jwt
import pytest

from protoflask import auth
from protoflask.auth import TokenAuthority
from protoflask.core.errors import InvalidToken, MissingToken

from .support import SECRET


def sign(claims: dict, key: str = SECRET, algorithm: str = "HS256", **header) -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers=header or None)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _outcome(authority: TokenAuthority, token: str) -> tuple[str, object]:
    try:
        return "ok", authority.verify_with_expiry(token)
    except (InvalidToken, MissingToken) as exc:
        return "refused", (exc.code, exc.message)


def _cases() -> list[str]:
    now = int(time.time())
    body = _b64(b'{"sub":"alice","exp":%d}' % (now + 60))
    head = _b64(b'{"alg":"HS256","typ":"JWT"}')
    other = sign({"sub": "alice", "exp": now + 60}, key="another-secret-another-secret-xx")
    return [
        sign({"sub": "alice", "exp": now + 60}),
        sign({"sub": "alice", "exp": now + 60, "iat": now, "nbf": now - 1, "x": [1]}),
        sign({"userId": 42, "exp": now + 60}),
        sign({"user_id": "bob", "exp": now + 60, "jti": "j1", "iss": "me"}),
        sign({"sub": "alice", "exp": now - 5}),  # expired
        sign({"sub": "alice", "exp": now}),  # expired at exp
        sign({"sub": "alice"}),  # no exp
        sign({"sub": "alice", "exp": now + 60, "nbf": now + 30}),  # not yet valid
        sign({"sub": "alice", "exp": now + 60, "iat": now + 30}),  # issued in the future
        sign({"sub": "alice", "exp": float(now + 60)}),  # a float exp (PyJWT's int())
        sign({"sub": "alice", "exp": str(now + 60)}),  # a string exp
        sign({"sub": "alice", "exp": None}),
        sign({"sub": "alice", "exp": True}),
        sign({"sub": 7, "exp": now + 60}),  # PyJWT: sub must be a string
        sign({"sub": "alice", "exp": now + 60, "jti": 3}),
        sign({"sub": "alice", "exp": now + 60, "aud": "them"}),
        sign({"sub": "", "exp": now + 60}),
        sign({"name": "alice", "exp": now + 60}),  # no user claim
        sign({"sub": "alice", "exp": now + 60}, kid="k1"),
        sign({"sub": "alice", "exp": now + 60}, cty="x"),
        sign({"sub": "alice", "exp": now + 60}, typ="at+jwt"),
        other,  # the wrong secret
        f"{head}.{body}.{other.rsplit('.', 1)[1]}",  # a signature of another payload
        f"{head}.{body}.",
        f"{head}.{body}",
        f"{head}.{_b64(b'[1,2]')}.AAAA",
        "not-a-token",
        "a.b.c",
        "",
    ]


@pytest.fixture(autouse=True, params=[True, False], ids=["keyed", "one-shot"])
def keyed_hmac(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test both ways of the swap point ``TokenAuthority.keyed_hmac``."""
    monkeypatch.setattr(TokenAuthority, "keyed_hmac", request.param)
    return bool(request.param)


class TestFastHs256:
    """The swap point ``TokenAuthority.fast_hs256``: the fast check either defers (None)
    or answers exactly what PyJWT answers, and verify says the same either way."""

    def test_the_keyed_hmac_is_the_one_shot_hmac(self, keyed_hmac: bool) -> None:
        authority = TokenAuthority(SECRET)
        for message in (b"", b"a.b", b"x" * 200, "é.€".encode()):
            assert authority._signature(message) \
                == hmac.digest(SECRET.encode(), message, "sha256")
        assert authority._keyed is not None

    @pytest.mark.parametrize("token", _cases())
    def test_the_fast_check_defers_or_agrees_with_pyjwt(self, token: str) -> None:
        fast = TokenAuthority(SECRET)
        assert fast.fast_hs256 is not None
        claims = fast.fast_hs256(token) if token else None
        if claims is not None:
            assert claims == fast._decode(token, "HS256", None)

    @pytest.mark.parametrize("token", _cases())
    def test_verify_answers_the_same_with_and_without_it(self, token: str) -> None:
        fast, plain = TokenAuthority(SECRET), TokenAuthority(SECRET)
        plain.fast_hs256 = None
        assert _outcome(fast, token) == _outcome(plain, token)
        assert _outcome(fast, token) == _outcome(plain, token)  # remembered: the same

    def test_one_authority_answers_every_token_as_pyjwt_in_turn(self) -> None:
        """The header checks it remembers (by the header segment) are shared by all the
        tokens it sees: each token, in any order, still answered as PyJWT answers it."""
        fast, plain = TokenAuthority(SECRET), TokenAuthority(SECRET)
        plain.fast_hs256 = None
        cases = _cases()
        for token in cases + cases[::-1]:
            assert _outcome(fast, token) == _outcome(plain, token), token
        assert 0 < len(fast._headers) <= auth.HEADERS_KEPT

    def test_the_headers_remembered_are_bounded(self, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
        monkeypatch.setattr(auth, "HEADERS_KEPT", 2)
        fast, plain = TokenAuthority(SECRET), TokenAuthority(SECRET)
        plain.fast_hs256 = None
        now = int(time.time())
        for i in range(5):
            token = sign({"sub": "alice", "exp": now + 60}, kid=f"k{i}")
            assert _outcome(fast, token) == _outcome(plain, token)
        assert len(fast._headers) == 2

    @pytest.mark.parametrize("segment", [
        "", "e30", "eyJhbGciOiJIUzI1NiJ9", "a-b_c", "a+b/c", "abc=", "ab", "a", "a b\nc",
        "!!!!", "é", "ab\u0100", "YWJj" * 50])
    def test_b64_answers_as_urlsafe_b64decode(self, segment: str) -> None:
        def outcome(decode: Callable[[], bytes]) -> object:
            try:
                return decode()
            except ValueError:  # binascii.Error and UnicodeEncodeError are ValueErrors
                return ValueError
        padded = segment + "=" * (-len(segment) % 4)
        assert outcome(lambda: auth._b64(segment)) \
            == outcome(lambda: base64.urlsafe_b64decode(padded))

    def test_common_tokens_take_the_fast_path(self) -> None:
        authority = TokenAuthority(SECRET)
        token = sign({"sub": "alice", "exp": int(time.time()) + 60, "iat": 1})
        assert authority.fast_hs256 is not None and authority.fast_hs256(token) is not None

    def test_not_with_an_audience_an_issuer_or_without_hs256(self) -> None:
        assert TokenAuthority(SECRET, audience="a").fast_hs256 is None
        assert TokenAuthority(SECRET, issuer="i").fast_hs256 is None
        assert TokenAuthority(SECRET, algorithms=["HS512"]).fast_hs256 is None
        assert TokenAuthority(None).fast_hs256 is None


class TestRemembered:
    def test_each_distinct_token_is_verified_once(self, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
        authority = TokenAuthority(SECRET)
        checked = []
        fast = authority.fast_hs256
        assert fast is not None
        authority.fast_hs256 = lambda t: checked.append(t) or fast(t)
        exp = int(time.time()) + 60
        tokens = [sign({"sub": f"u{i}", "exp": exp}) for i in range(3000)]
        for _ in range(2):
            assert [authority.verify(t) for t in tokens] == [f"u{i}" for i in range(3000)]
        assert len(checked) == 3000  # the second round came from the cache

    def test_the_cache_is_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(auth, "VERIFIED_CACHE_SIZE", 100)
        authority = TokenAuthority(SECRET)
        exp = int(time.time()) + 60
        for i in range(1000):
            authority.verify(sign({"sub": f"u{i}", "exp": exp}))
            assert len(authority._verified) <= 100
        newest = sign({"sub": "u999", "exp": exp})
        assert newest.rsplit(".", 1)[1] in authority._verified  # the oldest went first

    def test_a_remembered_token_still_expires(self, monkeypatch: pytest.MonkeyPatch) -> None:
        authority = TokenAuthority(SECRET)
        exp = int(time.time()) + 60
        token = sign({"sub": "alice", "exp": exp})
        assert authority.verify(token) == "alice"
        monkeypatch.setattr(time, "time", lambda: float(exp))
        with pytest.raises(InvalidToken, match="expired"):
            authority.verify(token)
        assert token.rsplit(".", 1)[1] not in authority._verified  # forgotten

    def test_a_remembered_signature_on_another_payload_is_refused(self) -> None:
        """The cache is keyed by the signature: a token pairing a remembered signature
        with another user's claims must not be taken as the remembered one."""
        authority = TokenAuthority(SECRET)
        exp = int(time.time()) + 60
        alice = sign({"sub": "alice", "exp": exp})
        assert authority.verify(alice) == "alice"
        head, _, sig = alice.split(".")
        body = _b64(b'{"sub":"mallory","exp":%d}' % exp)
        forged = f"{head}.{body}.{sig}"
        with pytest.raises(InvalidToken):
            authority.verify(forged)
        assert authority.verify(alice) == "alice"

    def test_a_token_of_a_key_that_left_the_keys_is_refused(self) -> None:
        """Tokens checked with public keys are not remembered: once the key is gone
        (revoked from the JWKS), its tokens are refused."""
        from cryptography.hazmat.primitives.asymmetric import ec

        from protoflask.jwks import PublicKey, algorithms_for

        private = ec.generate_private_key(ec.SECP256R1())
        key = PublicKey(private.public_key(), frozenset(algorithms_for(private.public_key())),
                        "k1")
        authority = TokenAuthority(None, algorithms=["ES256"], public_keys=[key])
        token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, private,
                           algorithm="ES256", headers={"kid": "k1"})
        assert authority.verify(token) == "alice"
        authority._public_keys.clear()  # the key is revoked
        with pytest.raises(InvalidToken):
            authority.verify(token)
