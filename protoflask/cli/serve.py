"""The server-side commands: `serve` (flags generated from the configuration table;
`--dev` for a random secret and a ready token) and `token`.

`serve` runs protoflask's own gevent server in this process, which suits development
and small deployments; production runs `gunicorn -k gevent wsgi:app` (README). Nothing
here imports the server before `serve` has monkey-patched the process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from .devtoken import forget_dev_token, save_dev_token
from .usage import EXIT_CONNECTION, EXIT_USAGE, UsageError

#: The next steps `serve --dev` prints, the same as the README's quickstart.
DEV_HINTS = ("protoflask chat", "protoflask call add '{\"a\": 2, \"b\": 40}'",
             "protoflask tools", "protoflask ping", "protoflask stats")


def _flag(attr: str, flow: bool) -> str:
    return "--" + ("flow-control-" if flow else "") + attr.replace("_", "-")


#: Options that get no flag: the secret (a command line is visible to every user of the
#: machine; use JWT_SECRET) and devMode (``--dev``).
_NO_FLAG = {"jwtSecret", "devMode"}


def _shown_default(opt: Any) -> str:
    """A default as a person reads it in --help (never `None` or an empty string)."""
    default = opt.default
    if default is None:
        return "unset"
    if isinstance(default, (list, tuple)):
        return ",".join(default) or "empty"
    if isinstance(default, bool):
        return "on" if default else "off"
    text = str(default)
    # argparse expands %-formats in help strings
    return text.replace("%", "%%") if text else "empty"


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per row of config.OPTIONS / FLOW_OPTIONS, so they cannot drift apart."""
    from ..config import FLOW_OPTIONS, OPTIONS

    group = parser.add_argument_group("configuration (default: the environment, then the "
                                      "built-in default; README has the table)")
    for flow, options in ((False, OPTIONS), (True, FLOW_OPTIONS)):
        for opt in options:
            if opt.key in _NO_FLAG:
                continue
            shown = _shown_default(opt) + (", 127.0.0.1 with --dev" if opt.key == "host"
                                           else "")
            help_text = f"{opt.doc.replace('%', '%%')} (env {opt.env}; default: {shown})"
            dest = ("flow." if flow else "") + opt.key
            kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": help_text}
            if opt.kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif opt.kind is list:
                kwargs["type"] = lambda raw: tuple(p.strip() for p in raw.split(",") if p.strip())
                kwargs["metavar"] = "A,B"
            else:
                kwargs["type"] = opt.kind
                kwargs["metavar"] = opt.kind.__name__.upper()
                if opt.choices:
                    kwargs["choices"] = opt.choices
            group.add_argument(_flag(opt.attr, flow), **kwargs)


#: Arguments of `serve` and `config` that are not configuration options.
_NOT_CONFIG = {"command", "run", "dev", "app", "reload", "json"}


def config_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    flow: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if value is None:
            continue
        if dest.startswith("flow."):
            flow[dest[5:]] = value
        elif dest[:1].islower() and dest not in _NOT_CONFIG:
            config[dest] = value
    if flow:
        config["flowControl"] = flow
    return config


def serve(args: argparse.Namespace) -> int:
    if args.reload:
        from .reload import run_reloading

        return run_reloading(args.dev)

    from gevent import monkey

    monkey.patch_all()  # before the application imports sockets or threading

    from ..config import ConfigError
    from ..logs import configure_logging
    from ..server import ProtoServer

    configure_logging()
    config = config_from_flags(args)
    if args.dev:
        config["devMode"] = True
        config.setdefault("nodeEnv", "development")
        if not os.environ.get("HOST"):  # a development server is not for the network
            config.setdefault("host", "127.0.0.1")
    try:
        server = load_app(args.app, config) if args.app else ProtoServer(config)
    except ConfigError as exc:
        print(f"protoflask serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        server.start()
    except OSError as exc:
        print(f"protoflask serve: cannot listen on {server.config.host}:{server.config.port}:"
              f" {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CONNECTION
    host = "127.0.0.1" if server.config.host in ("0.0.0.0", "::") else server.config.host
    base = f"http://{host}:{server.port}"
    print(f"protoflask listening on {base}  (health: {base}/health)", flush=True)
    token = server.dev_token
    if token:
        saved = save_dev_token(base, token)
        # The link carries the token in its fragment, which the browser never sends; the
        # page takes it out of the address bar once read.
        lines = ["development mode: a random secret and a token for user 'dev':",
                 f"export PROTOFLASK_TOKEN={token}",
                 f"dashboard and playground: {base}/#token={token}"]
        if saved:
            lines.append(f"the token is saved in {saved} for the client commands; "
                         "in another terminal try:")
        else:
            lines.append("in another terminal, after the export line above, try:")
        lines += [f"  {hint}" for hint in DEV_HINTS]
        print("\n".join(lines), flush=True)
    try:
        server.serve_forever()
    finally:
        if token:
            forget_dev_token(token)
    print("protoflask stopped", flush=True)
    return 0


def load_app(spec: str, config: dict[str, Any]) -> Any:
    """``--app module:name``: the ProtoServer ``name`` in ``module`` (imported from the
    current directory), or the one mounted on a Flask app there; ``name()`` calls a
    factory. The flags' configuration reaches it through the environment (set before the
    import), so what the code passes to ProtoServer itself still wins."""
    import importlib

    from flask import Flask

    from ..options import FLOW_OPTIONS, OPTIONS
    from ..server import ProtoServer

    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"--app {spec!r}: expected module:name, e.g. myapp:proto")
    top = {opt.key: opt for opt in OPTIONS}
    flow = {opt.key: opt for opt in FLOW_OPTIONS}
    given = [(top.get(k), v) for k, v in config.items() if k != "flowControl"]
    given += [(flow.get(k), v) for k, v in config.get("flowControl", {}).items()]
    for opt, value in given:
        if opt is not None and opt.env:
            os.environ[opt.env] = ",".join(value) if isinstance(value, tuple) \
                else str(value).lower() if isinstance(value, bool) else str(value)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    name = attr or "proto"
    call = name.endswith("()")
    found = getattr(module, name[:-2] if call else name, None)
    if found is None:
        raise UsageError(f"--app {spec!r}: {module_name} has no {name!r}")
    if call:
        found = found()
    if isinstance(found, Flask):
        found = found.extensions.get("protoflask")
    if not isinstance(found, ProtoServer):
        raise UsageError(f"--app {spec!r}: not a ProtoServer, nor a Flask app with one "
                         "mounted (ProtoServer(app=app))")
    return found


def token(args: argparse.Namespace) -> int:
    from ..auth import TokenAuthority, weak_secret_warning

    if args.private_key:
        return _signed_token(args)
    secret = args.secret or os.environ.get("JWT_SECRET")
    if not secret:
        raise UsageError("set JWT_SECRET or pass --secret (or --private-key for an "
                         "RS/PS/ES/EdDSA token)")
    weak = weak_secret_warning(secret)
    if weak:
        print(f"protoflask token: warning: {weak}", file=sys.stderr)
    try:
        print(TokenAuthority(secret).issue(args.user, args.expires))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _signed_token(args: argparse.Namespace) -> int:
    """A token signed with a private key, as an identity provider would issue it (for a
    server configured with the public half: JWT_PUBLIC_KEY or JWKS_URL)."""
    import jwt
    from cryptography.hazmat.primitives import serialization

    from ..jwks import algorithms_for
    from ..options import parse_duration

    try:
        with open(args.private_key, "rb") as fh:
            # Any: jwt.encode takes fewer key types than PEM can hold; algorithms_for
            # below refuses the others
            key: Any = serialization.load_pem_private_key(fh.read(), password=None)
        lifetime = parse_duration(args.expires or "24h")
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--private-key: {exc}") from None
    allowed = algorithms_for(key.public_key())
    alg = args.alg or ("RS256" if "RS256" in allowed else min(allowed, default=""))
    if alg not in allowed:
        raise UsageError(f"--alg {alg or '?'} does not fit this key (use one of "
                         f"{', '.join(sorted(allowed)) or 'no algorithm: unsupported key'})")
    now = int(time.time())
    claims = {"sub": args.user, "iat": now, "exp": now + lifetime}
    if args.aud:
        claims["aud"] = args.aud
    if args.iss:
        claims["iss"] = args.iss
    print(jwt.encode(claims, key, algorithm=alg, headers={"kid": args.kid} if args.kid else None))
    return 0
