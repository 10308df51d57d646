"""JWT verification and issuing with PyJWT (CONTRACT 3)."""

from __future__ import annotations

import re
import time
from typing import Any, Iterable

import jwt

from .core.errors import InvalidToken, MissingToken

USER_CLAIMS = ("sub", "userId", "user_id")
_DURATION = re.compile(r"\s*(\d+)\s*([smhd]?)\s*\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> int:
    """'30s', '15m', '24h', '7d', or a number of seconds (number or numeric string)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"duration must be positive, got {value!r}")
        return int(value)
    match = _DURATION.match(str(value))
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"expected a duration like 30s, 15m, 24h, 7d or seconds, got {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


class TokenAuthority:
    """Verifies and issues the server's tokens."""

    def __init__(self, secret: str, algorithms: Iterable[str] = ("HS256",),
                 expires_in: str | int = "24h", *, require_exp: bool = True) -> None:
        self._secret = secret
        self.require_exp = require_exp  # a token without exp would never expire
        self.algorithms = [a for a in algorithms if a.lower() != "none"]
        self.expires_in = parse_duration(expires_in)

    def verify(self, token: str | None) -> str:
        """The token's user id, or MissingToken / InvalidToken."""
        if not token:
            raise MissingToken()
        try:
            claims = jwt.decode(token, self._secret, algorithms=self.algorithms,
                                options={"require": ["exp"] if self.require_exp else [],
                                         "verify_exp": True})
        except jwt.ExpiredSignatureError:
            raise InvalidToken("token expired") from None
        except jwt.MissingRequiredClaimError:
            raise InvalidToken("token has no exp claim (jwtRequireExp)") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        for claim in USER_CLAIMS:
            user = claims.get(claim)
            if isinstance(user, (str, int)) and not isinstance(user, bool) and str(user):
                return str(user)
        raise InvalidToken("token has no user claim (sub, userId or user_id)")

    def issue(self, user_id: str, expires_in: str | int | None = None,
              **claims: Any) -> str:
        now = int(time.time())
        lifetime = self.expires_in if expires_in is None else parse_duration(expires_in)
        payload = {"sub": str(user_id), "iat": now, "exp": now + lifetime, **claims}
        return jwt.encode(payload, self._secret, algorithm=self.algorithms[0])


def token_from_request(query_token: str | None, authorization: str | None) -> str | None:
    """The token from ``?token=`` or ``Authorization: Bearer``, whichever is present."""
    if query_token:
        return query_token
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None
