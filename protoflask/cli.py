"""The ``protoflask`` command: ``serve`` (with ``--dev``) and ``token``.

``serve`` runs protoflask's own gevent server in this process, which suits development
and small deployments; production runs ``gunicorn -k gevent wsgi:app`` (README).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence


def _serve(args: argparse.Namespace) -> int:
    from gevent import monkey

    monkey.patch_all()  # before the application imports sockets or threading

    from .config import ConfigError
    from .logs import configure_logging
    from .server import ProtoServer

    configure_logging()
    config: dict[str, object] = {}
    if args.host is not None:
        config["host"] = args.host
    if args.port is not None:
        config["port"] = args.port
    if args.dev:
        config["devMode"] = True
        config.setdefault("nodeEnv", "development")
    try:
        server = ProtoServer(config)
    except ConfigError as exc:
        print(f"protoflask: {exc}", file=sys.stderr)
        return 2
    server.start()
    host = "127.0.0.1" if server.config.host in ("0.0.0.0", "::") else server.config.host
    base = f"http://{host}:{server.port}"
    print(f"protoflask listening on {base}  (health: {base}/health)", flush=True)
    if server.dev_token:
        print("development mode: random secret; a token for user 'dev':\n"
              f"  {server.dev_token}\n"
              f"  ws://{host}:{server.port}/proto/websocket?token={server.dev_token}",
              flush=True)
    server.serve_forever()
    print("protoflask stopped", flush=True)
    return 0


def _token(args: argparse.Namespace) -> int:
    from .auth import TokenAuthority

    secret = args.secret or os.environ.get("JWT_SECRET")
    if not secret:
        print("protoflask token: set JWT_SECRET or pass --secret", file=sys.stderr)
        return 2
    try:
        print(TokenAuthority(secret).issue(args.user, args.expires))
    except ValueError as exc:
        print(f"protoflask token: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="protoflask", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server (config from the environment)")
    serve.add_argument("--dev", action="store_true",
                       help="development mode: random secret, prints a ready token")
    serve.add_argument("--host", help="bind address (env HOST, default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="port (env PORT, default 8080; 0 = any)")
    serve.set_defaults(run=_serve)
    token = sub.add_parser("token", help="issue a token signed with JWT_SECRET")
    token.add_argument("--user", required=True)
    token.add_argument("--expires", default=None, help="30s, 15m, 24h, 7d or seconds")
    token.add_argument("--secret", default=None, help="defaults to $JWT_SECRET")
    token.set_defaults(run=_token)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
