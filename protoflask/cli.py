"""The ``protoflask`` command.

Server side: ``serve`` (flags generated from the configuration table; ``--dev`` for a
random secret and a ready token) and ``token``. Client side, on protoflask.client:
``ping``, ``chat``, ``call``, ``stats``.

Exit codes: 0 success, 1 the server answered with an error (a tool failed, a run was
refused), 2 bad usage (flags, JSON, no token), 3 no session (unreachable server, refused
connection such as 401 INVALID_TOKEN, lost session), 130 interrupted.

``serve`` runs protoflask's own gevent server in this process, which suits development
and small deployments; production runs ``gunicorn -k gevent wsgi:app`` (README).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

EXIT_SERVER_ERROR, EXIT_USAGE, EXIT_CONNECTION, EXIT_INTERRUPTED = 1, 2, 3, 130
DEFAULT_URL = "http://127.0.0.1:8080"


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message."""


# -- the development token file --------------------------------------------------------------
# `serve --dev` saves its token (and URL) here so `protoflask chat` in another terminal
# needs no copy-paste. It lives in the user's cache directory, mode 0600, and is removed
# when that server stops. PROTOFLASK_DEV_TOKEN_FILE moves it (tests).


def dev_token_file() -> Path:
    explicit = os.environ.get("PROTOFLASK_DEV_TOKEN_FILE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "protoflask" / "dev-token.json"


def _same_server(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        url = url.rstrip("/")
        for local in ("localhost", "0.0.0.0", "[::1]"):
            url = url.replace(f"//{local}:", "//127.0.0.1:")
        return url
    return norm(a) == norm(b)


def _save_dev_token(url: str, token: str) -> Path | None:
    path = dev_token_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"url": url, "token": token}, fh)
    except OSError:
        return None
    return path


def _forget_dev_token(token: str) -> None:
    path = dev_token_file()
    try:
        if json.loads(path.read_text()).get("token") == token:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _dev_token_for(url: str) -> str | None:
    try:
        saved = json.loads(dev_token_file().read_text())
    except (OSError, ValueError):
        return None
    if isinstance(saved, dict) and _same_server(str(saved.get("url", "")), url):
        token = saved.get("token")
        return token if isinstance(token, str) else None
    return None


# -- serve ------------------------------------------------------------------------------------


def _flag(attr: str, flow: bool) -> str:
    return "--" + ("flow-control-" if flow else "") + attr.replace("_", "-")


#: Options that get no flag: the secret (a command line is visible to every user of the
#: machine; use JWT_SECRET) and devMode (``--dev``).
_NO_FLAG = {"jwtSecret", "devMode"}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per row of config.OPTIONS / FLOW_OPTIONS, so they cannot drift apart."""
    from .config import FLOW_OPTIONS, OPTIONS

    group = parser.add_argument_group("configuration (default: the environment, then the "
                                      "built-in default; README has the table)")
    for flow, options in ((False, OPTIONS), (True, FLOW_OPTIONS)):
        for opt in options:
            if opt.key in _NO_FLAG:
                continue
            default = ",".join(opt.default) if opt.kind is list else opt.default
            help_text = f"{opt.doc} (env {opt.env}, default {default})"
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


def _config_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    flow: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if value is None:
            continue
        if dest.startswith("flow."):
            flow[dest[5:]] = value
        elif dest[:1].islower() and dest not in ("command", "run", "dev"):
            config[dest] = value
    if flow:
        config["flowControl"] = flow
    return config


def _serve(args: argparse.Namespace) -> int:
    from gevent import monkey

    monkey.patch_all()  # before the application imports sockets or threading

    from .config import ConfigError
    from .logs import configure_logging
    from .server import ProtoServer

    configure_logging()
    config = _config_from_flags(args)
    if args.dev:
        config["devMode"] = True
        config.setdefault("nodeEnv", "development")
    try:
        server = ProtoServer(config)
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
        saved = _save_dev_token(base, token)
        print("development mode: random secret; a token for user 'dev':\n"
              f"  {token}\n"
              f"  ws://{host}:{server.port}/proto/websocket?token={token}\n"
              # in the fragment: the page reads it, the browser never sends it
              f"dashboard: {base}/#token={token}\n"
              f"export PROTOFLASK_TOKEN={token}\n"
              + (f"(saved to {saved}: `protoflask chat --url {base}` in another terminal "
                 "uses it)" if saved else ""),
              flush=True)
    try:
        server.serve_forever()
    finally:
        if token:
            _forget_dev_token(token)
    print("protoflask stopped", flush=True)
    return 0


def _token(args: argparse.Namespace) -> int:
    from .auth import TokenAuthority, parse_duration

    if args.private_key:
        return _signed_token(args, parse_duration)
    secret = args.secret or os.environ.get("JWT_SECRET")
    if not secret:
        raise UsageError("set JWT_SECRET or pass --secret (or --private-key for an "
                         "RS/PS/ES/EdDSA token)")
    try:
        print(TokenAuthority(secret).issue(args.user, args.expires))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _signed_token(args: argparse.Namespace, parse_duration: Any) -> int:
    """A token signed with a private key, as an identity provider would issue it (for a
    server configured with the public half: JWT_PUBLIC_KEY or JWKS_URL)."""
    import jwt
    from cryptography.hazmat.primitives import serialization

    from .jwks import algorithms_for

    try:
        with open(args.private_key, "rb") as fh:
            key = serialization.load_pem_private_key(fh.read(), password=None)
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


# -- client commands ----------------------------------------------------------------------------


def _token_for(args: argparse.Namespace) -> str:
    token = args.token or os.environ.get("PROTOFLASK_TOKEN") or _dev_token_for(args.url)
    if not token:
        raise UsageError("no token: pass --token, set PROTOFLASK_TOKEN, or start the server "
                         "with `protoflask serve --dev` (its token is picked up)")
    return token


def _client(args: argparse.Namespace, **options: Any) -> Any:
    from .client import Client

    return Client(args.url, _token_for(args), transport=args.transport,
                  timeout=args.timeout, **options).connect()


def _ping(args: argparse.Namespace) -> int:
    rtts: list[float] = []
    with _client(args) as client:
        print(f"PING {args.url} over {args.transport}, session {client.session_id}")
        for n in range(1, args.count + 1):
            rtt = client.ping(timeout=args.timeout) * 1000
            rtts.append(rtt)
            print(f"pong {n}: time={rtt:.2f} ms", flush=True)
            if n < args.count:
                time.sleep(args.interval)
    print(f"{len(rtts)} pongs, min/avg/max = {min(rtts):.2f}/{sum(rtts) / len(rtts):.2f}/"
          f"{max(rtts):.2f} ms")
    return 0


def _chat(args: argparse.Namespace) -> int:
    """Each stdin line is sent as a text; the server's texts are printed as they stream."""
    interactive = sys.stdin.isatty()
    prefix = "agent> " if interactive else ""
    replies = threading.Semaphore(0)
    last_activity = [time.monotonic()]
    open_texts: set[str] = set()

    def on_message(msg: dict[str, Any]) -> None:
        last_activity[0] = time.monotonic()
        mtype, payload = msg["type"], msg["payload"]
        if mtype == "MESSAGE_START":
            open_texts.add(payload.get("message_id"))
            sys.stdout.write(prefix)
        elif mtype == "MESSAGE_PART" and payload.get("message_id") in open_texts:
            sys.stdout.write(payload.get("content", ""))
        elif mtype == "MESSAGE_END" and payload.get("message_id") in open_texts:
            open_texts.discard(payload.get("message_id"))
            sys.stdout.write("\n")
            replies.release()
        elif mtype == "ERROR":
            print(f"error {payload.get('code')}: {payload.get('message')}", file=sys.stderr)
        sys.stdout.flush()

    sent = 0
    with _client(args, on_message=on_message) as client:
        if interactive:
            print(f"connected over {args.transport} (session {client.session_id}); "
                  "type a message, Ctrl-D to quit", file=sys.stderr)
        for line in sys.stdin:
            text = line.rstrip("\n")
            if not text:
                continue
            client.send_text(text)
            sent += 1
            if interactive:  # wait for the reply before the next prompt
                replies.acquire(timeout=args.wait)
        if not interactive:  # stdin ended: wait for the replies (until idle for --wait s)
            got = 0
            while got < sent:
                if replies.acquire(timeout=0.1):
                    got += 1
                elif time.monotonic() - last_activity[0] > args.wait:
                    break
    return 0


def _progress_bar(progress: float | None, status: str, partial: Any) -> None:
    """TOOL_UPDATE on stderr: a bar redrawn in place on a terminal, a line each otherwise."""
    if progress is None:
        line = f"{status.lower():<8}"
    else:
        filled = int(max(0.0, min(100.0, progress)) / 5)
        line = f"[{'#' * filled}{'.' * (20 - filled)}] {progress:5.1f}%"
    if sys.stderr.isatty():
        _progress_bar.drawn = True  # type: ignore[attr-defined]
        sys.stderr.write("\r" + line)
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _call(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise UsageError(f"params are not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise UsageError("params must be a JSON object, e.g. '{\"a\": 1}'")
    with _client(args) as client:
        try:
            result = client.call_tool(args.tool, params, on_progress=_progress_bar,
                                      timeout=args.call_timeout)
        finally:
            if getattr(_progress_bar, "drawn", False):  # clear the terminal's bar
                sys.stderr.write("\r\033[K")
    print(json.dumps(result, indent=2 if sys.stdout.isatty() else None))
    return 0


def _stats(args: argparse.Namespace) -> int:
    import http.client

    from .client._http import BaseURL, failed, refused

    base = BaseURL(args.url)
    conn = None
    try:
        conn = base.http(args.timeout)
        conn.request("GET", base.path("/stats"), headers={"Accept": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise failed(exc, base) from None
    finally:
        if conn is not None:
            conn.close()
    if resp.status != 200:
        raise refused(resp.status, body)
    print(json.dumps(json.loads(body), indent=2))
    return 0


# -- the parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protoflask", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server (config from flags, then the env)")
    serve.add_argument("--dev", action="store_true",
                       help="development mode: random secret, prints a ready token and "
                            "saves it for the client commands")
    _add_config_flags(serve)
    serve.set_defaults(run=_serve)

    token = sub.add_parser("token", help="issue a token signed with JWT_SECRET, or with a "
                                         "private key (--private-key)")
    token.add_argument("--user", required=True)
    token.add_argument("--expires", default=None, help="30s, 15m, 24h, 7d or seconds")
    token.add_argument("--secret", default=None, help="defaults to $JWT_SECRET")
    token.add_argument("--private-key", default=None, metavar="PEM",
                       help="sign with this private key file instead (RS/PS/ES/EdDSA), for a "
                            "server given the public key (JWT_PUBLIC_KEY or JWKS_URL)")
    token.add_argument("--alg", default=None,
                       help="with --private-key: RS256 (RSA), ES256 (P-256), EdDSA, ...; "
                            "default: the key type's first")
    token.add_argument("--kid", default=None, help="with --private-key: the key id header")
    token.add_argument("--aud", default=None, help="with --private-key: the aud claim")
    token.add_argument("--iss", default=None, help="with --private-key: the iss claim")
    token.set_defaults(run=_token)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("PROTOFLASK_URL", DEFAULT_URL),
                        help="server base URL (env PROTOFLASK_URL, default %(default)s)")
    common.add_argument("--token", default=None,
                        help="a JWT (default: $PROTOFLASK_TOKEN, else the token a local "
                             "`serve --dev` saved)")
    common.add_argument("--transport", choices=("ws", "sse", "stream"), default="ws",
                        help="WebSocket, SSE + POST, or the NDJSON HTTP stream (default ws)")
    common.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the server (default 10)")

    ping = sub.add_parser("ping", parents=[common], help="round-trip times to the server")
    ping.add_argument("--count", "-c", type=int, default=4)
    ping.add_argument("--interval", type=float, default=0.2, help="seconds between pings")
    ping.set_defaults(run=_ping)

    chat = sub.add_parser("chat", parents=[common],
                          help="send stdin lines as texts, print the server's replies")
    chat.add_argument("--wait", type=float, default=5.0,
                      help="seconds to wait for a reply (default 5)")
    chat.set_defaults(run=_chat)

    call = sub.add_parser("call", parents=[common],
                          help="call a tool: progress on stderr, result JSON on stdout")
    call.add_argument("tool")
    call.add_argument("params", nargs="?", default="{}", help="JSON object (default {})")
    call.add_argument("--call-timeout", type=float, default=None,
                      help="seconds to wait for the result (default: no limit)")
    call.set_defaults(run=_call)

    stats = sub.add_parser("stats", parents=[common], help="GET /stats (no token needed)")
    stats.set_defaults(run=_stats)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        from .client.errors import (
            ClientTimeout, ConnectionFailed, ConnectionLost, ConnectionRefused,
            ProtoClientError,
        )

        if isinstance(exc, ConnectionFailed):
            print(f"{name}: server unreachable: {exc.message}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, (ConnectionRefused, ConnectionLost)):
            print(f"{name}: {exc}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, ClientTimeout):
            print(f"{name}: {exc.message}", file=sys.stderr)
            return EXIT_CONNECTION
        if isinstance(exc, ProtoClientError):
            detail = f" {json.dumps(exc.detail)}" if exc.detail is not None else ""
            print(f"{name}: {exc.code}: {exc.message}{detail}", file=sys.stderr)
            return EXIT_SERVER_ERROR
        raise


if __name__ == "__main__":
    sys.exit(main())
