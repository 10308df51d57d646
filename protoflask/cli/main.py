"""The `protoflask` command line: the parser of every command, and one exit code for
every failure."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from .commands import call as run_call
from .commands import chat as run_chat
from .commands import ping as run_ping
from .commands import stats as run_stats
from .commands import tools as run_tools
from .serve import add_config_flags
from .serve import serve as run_serve
from .serve import token as run_token
from .inspect import checktoken as run_checktoken
from .inspect import config as run_config
from .devtoken import default_url
from .usage import (
    DEFAULT_URL, EXIT_CONNECTION, EXIT_INTERRUPTED, EXIT_SERVER_ERROR, EXIT_USAGE, UsageError,
)

#: What `protoflask --help` shows (plain text: argparse prints it as it is).
DESCRIPTION = """\
protoflask: a real-time agent protocol server and its command-line client.

  protoflask serve --dev            run a development server (prints a ready token)
  protoflask chat                   type lines, see the replies
  protoflask call add '{"a": 2, "b": 40}'
  protoflask tools                  the server's tools and their schemas
  protoflask ping | stats
  protoflask checktoken TOKEN       verify a token, show its claims
  protoflask config                 the effective configuration, and where each value
                                    comes from

Run `protoflask COMMAND --help` for a command's options."""

EPILOG = """\
exit codes: 0 success, 1 the server answered with an error, 2 bad usage,
3 no session (unreachable, refused, lost), 130 interrupted"""


def _command(sub: Any, name: str, summary: str, description: str,
             parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """A subcommand with a one-line summary (in `protoflask --help`) and a description
    (first in `protoflask NAME --help`)."""
    return sub.add_parser(name, help=summary, description=description, parents=list(parents),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protoflask", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"protoflask {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    serve = _command(sub, "serve", "run the server",
                     "Run protoflask's own gevent server in this process (production runs "
                     "gunicorn -k gevent wsgi:app).\nEach option below overrides its "
                     "environment variable; the secret comes only from JWT_SECRET.")
    serve.add_argument("--dev", action="store_true",
                       help="development mode: a random secret, 127.0.0.1 unless --host or "
                            "HOST is given, and a ready token, printed and saved for the "
                            "client commands")
    serve.add_argument("--app", default=None, metavar="MODULE:NAME",
                       help="serve your own ProtoServer (or a Flask app with one mounted), "
                            "e.g. myapp:proto or myapp:create_app() (like `flask run "
                            "--app`); its module is imported from the current directory")
    serve.add_argument("--reload", action="store_true",
                       help="restart the server when a Python file under the current "
                            "directory changes (development)")
    add_config_flags(serve)
    serve.set_defaults(run=run_serve)

    token = _command(sub, "token", "issue a token signed with JWT_SECRET or a private key",
                     "Print a JWT for a user, signed with JWT_SECRET (or --secret), or with "
                     "a private key (--private-key) as an identity provider would sign it, "
                     "for a server given the public half (JWT_PUBLIC_KEY or JWKS_URL).")
    token.add_argument("--user", required=True, help="the user id (the token's sub)")
    token.add_argument("--expires", default=None,
                       help="lifetime: 30s, 15m, 24h, 7d or seconds (default: JWT_EXPIRES_IN,"
                            " else 24h)")
    token.add_argument("--secret", default=None, help="the HMAC secret (default: $JWT_SECRET)")
    token.add_argument("--private-key", default=None, metavar="PEM",
                       help="sign with this private key file instead (RSA, EC or Ed25519)")
    token.add_argument("--alg", default=None,
                       help="with --private-key: RS256, PS256, ES256, EdDSA, ... (default: "
                            "RS256 for RSA, else the key's only algorithm)")
    token.add_argument("--kid", default=None, help="with --private-key: the kid header")
    token.add_argument("--aud", default=None, help="with --private-key: the aud claim")
    token.add_argument("--iss", default=None, help="with --private-key: the iss claim")
    token.set_defaults(run=run_token)

    check = _command(sub, "checktoken", "verify a token and show its claims",
                     "Verify a JWT with the server's configuration (JWT_SECRET, "
                     "JWT_PUBLIC_KEY or JWKS_URL, JWT_AUDIENCE, JWT_ISSUER, ...) and print "
                     "its user and claims;\nexit 1 with the reason when the server would "
                     "refuse it.")
    check.add_argument("token", help="the JWT (- reads it from stdin)")
    check.add_argument("--secret", default=None, help="the HMAC secret (default: $JWT_SECRET)")
    check.set_defaults(run=run_checktoken)

    config = _command(sub, "config", "print the effective configuration and its sources",
                      "Print every option as `serve` would use it, with where its value "
                      "comes from: a flag,\nthe environment (which variable), or the "
                      "built-in default. The secret is never printed.")
    add_config_flags(config)
    config.add_argument("--dev", action="store_true", help="as `serve --dev` would see it")
    config.add_argument("--json", action="store_true", help="print JSON")
    config.set_defaults(run=run_config)

    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--url", default=None,
                       help="server base URL (default: $PROTOFLASK_URL, else the server a "
                            f"local `serve --dev` is running, else {DEFAULT_URL})")
    where.add_argument("--timeout", type=float, default=10.0,
                       help="seconds to wait for the server (default: 10)")
    session = argparse.ArgumentParser(add_help=False)
    session.add_argument("--token", default=None,
                         help="a JWT (default: $PROTOFLASK_TOKEN, else the token a local "
                              "`serve --dev` saved)")
    session.add_argument("--transport", choices=("ws", "sse", "stream"), default="ws",
                         help="ws (WebSocket), sse (SSE + POST) or stream (NDJSON over "
                              "HTTP) (default: ws)")
    common = (where, session)

    ping = _command(sub, "ping", "round-trip times to the server",
                    "Open a session and time PING/PONG round trips.", common)
    ping.add_argument("--count", "-c", type=int, default=4,
                      help="how many pings (default: 4)")
    ping.add_argument("--interval", type=float, default=0.2,
                      help="seconds between pings (default: 0.2)")
    ping.set_defaults(run=run_ping)

    chat = _command(sub, "chat", "send lines as texts, print the replies",
                    "On a terminal: prompts `you> `, sends each line as a text and waits for "
                    "the reply.\nWith piped input: sends every line, prints the replies, "
                    "exits once they are in.", common)
    chat.add_argument("--wait", type=float, default=5.0,
                      help="seconds to wait for a reply (default: 5)")
    chat.set_defaults(run=run_chat)

    call = _command(sub, "call", "call a tool",
                    "Call a tool: progress on stderr, the result as JSON on stdout; a "
                    "refused call prints\nthe error code and the reasons (e.g. which "
                    "params fail the tool's inputSchema).", common)
    call.add_argument("tool", help="the tool's name (see `protoflask tools`)")
    call.add_argument("params", nargs="?", default="{}",
                      help="the params, a JSON object (default: {})")
    call.add_argument("--call-timeout", type=float, default=None,
                      help="seconds to wait for the result (default: no limit)")
    call.set_defaults(run=run_call)

    tools = _command(sub, "tools", "list the server's tools and their schemas",
                     "List the tools this server offers (TOOL_LIST), with their input and "
                     "output schemas.", common)
    tools.add_argument("--json", action="store_true",
                       help="print the server's list as JSON")
    tools.set_defaults(run=run_tools)

    stats = _command(sub, "stats", "server statistics (no token needed)",
                     "GET /stats: connections, message rate, latency, error rate, uptime "
                     "(cluster-wide when\nthe server runs on Redis).", (where,))
    stats.add_argument("--json", action="store_true", help="print the /stats JSON as it is")
    stats.set_defaults(run=run_stats)
    return parser


def _detail_text(detail: Any) -> str:
    """Schema errors (``[{path, message}]``) one per line; any other detail as JSON."""
    if detail is None:
        return ""
    if isinstance(detail, list) and detail and all(
            isinstance(d, dict) and "message" in d for d in detail):
        return "".join(f"\n  {d.get('path') or '(top level)'}: {d['message']}" for d in detail)
    return f" {json.dumps(detail)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `protoflask`: what it can do
        parser.print_help()
        return 0
    url_from = "--url"
    if getattr(args, "url", "") is None:
        args.url, url_from = default_url()
    if getattr(args, "url", None) and "://" not in args.url:
        print(f"protoflask {args.command}: --url {args.url} has no scheme: use "
              f"http://{args.url} (or https://)", file=sys.stderr)
        return EXIT_USAGE
    run: Callable[[argparse.Namespace], int] = args.run
    name = f"protoflask {args.command}"
    try:
        return run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `protoflask stats | head`
        sys.stderr.close()
        return 0
    except UsageError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and a code
        from ..client.errors import (
            ClientTimeout, ConnectionFailed, ConnectionLost, ConnectionRefused,
            ProtoClientError,
        )

        if isinstance(exc, ConnectionFailed):
            hint = f" ({args.url}: {url_from})" if url_from != "--url" else ""
            print(f"{name}: server unreachable: {exc.message}{hint}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, (ConnectionRefused, ConnectionLost)):
            print(f"{name}: {exc}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, ClientTimeout):
            print(f"{name}: {exc.message}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, ProtoClientError):
            print(f"{name}: {exc.code}: {exc.message}{_detail_text(exc.detail)}",
                  file=sys.stderr)
            return EXIT_SERVER_ERROR
        raise
