"""The inspecting commands: `checktoken` (would the server take this token, and what does
it say) and `config` (the configuration `serve` would run with, and where each value
comes from)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .serve import config_from_flags
from .usage import EXIT_SERVER_ERROR, UsageError


def _load(config: dict[str, Any]) -> Any:
    from ..config import ConfigError, ServerConfig

    try:
        return ServerConfig.load(config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def checktoken(args: argparse.Namespace) -> int:
    from ..auth import authority_from_config
    from ..core.errors import ProtoError

    raw = sys.stdin.read().strip() if args.token == "-" else args.token.strip()
    config = _load({"jwtSecret": args.secret} if args.secret else {})
    if not (config.jwt_secret or config.jwt_public_key or config.jwks_url):
        raise UsageError("nothing to verify with: set JWT_SECRET (or pass --secret), "
                         "JWT_PUBLIC_KEY or JWKS_URL")
    try:
        user = authority_from_config(config).verify(raw)
    except ProtoError as exc:
        print(f"invalid: {exc.code}: {exc}", file=sys.stderr)
        return EXIT_SERVER_ERROR
    import jwt

    claims = jwt.decode(raw, options={"verify_signature": False})
    header = jwt.get_unverified_header(raw)
    print(f"valid: user {user!r} ({header.get('alg')}"
          + (f", kid {header['kid']}" if header.get("kid") else "") + ")")
    exp = claims.get("exp")
    if isinstance(exp, (int, float)):
        left = int(exp - time.time())
        print(f"expires: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(exp))} "
              f"(in {left // 3600} h {left % 3600 // 60} min)")
    print(json.dumps(claims, indent=2, sort_keys=True))
    return 0


def _flag_given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) is not None


def config(args: argparse.Namespace) -> int:
    """Each option: its value and its source (flag, environment variable, --dev, default)."""
    from ..config import FLOW_OPTIONS, OPTIONS

    explicit = config_from_flags(args)
    if args.dev:
        explicit["devMode"] = True
        explicit.setdefault("nodeEnv", "development")
        if not os.environ.get("HOST"):
            explicit.setdefault("host", "127.0.0.1")
    loaded = _load(explicit)
    rows: list[tuple[str, Any, str]] = []
    for flow, options in ((False, OPTIONS), (True, FLOW_OPTIONS)):
        for opt in options:
            dest = ("flow." if flow else "") + opt.key
            value = getattr(loaded.flow_control if flow else loaded, opt.attr)
            if opt.key == "jwtSecret":
                value = "(set, not shown)" if value else ("(random, --dev)" if args.dev
                                                         else None)
            if _flag_given(args, dest):
                source = "--" + ("flow-control-" if flow else "") + opt.attr.replace("_", "-")
            elif args.dev and opt.key in ("devMode", "nodeEnv", "host") \
                    and opt.key in explicit:
                source = "--dev"
            elif opt.env and opt.env in os.environ:
                source = f"env {opt.env}"
            else:
                source = "default"
            if opt.key == "jwtSecret" and args.dev and not loaded.jwt_secret:
                source = "--dev"
            key = ("flowControl." if flow else "") + opt.key
            rows.append((key, list(value) if isinstance(value, tuple) else value, source))
    if args.json:
        print(json.dumps({key: {"value": value, "source": source}
                          for key, value, source in rows}, indent=2))
        return 0
    width = max(len(key) for key, _, _ in rows)
    for key, value, source in rows:
        shown = json.dumps(value) if not isinstance(value, str) else value
        print(f"{key:<{width}}  {shown}  ({source})")
    return 0
