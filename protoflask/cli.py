"""The `protoflask` command.

Server side: `serve` (flags generated from the configuration table; `--dev` for a random
secret and a ready token) and `token`. Client side, on protoflask.client: `ping`, `chat`,
`call`, `tools`, `stats`.

Exit codes: 0 success, 1 the server answered with an error (a tool failed, a run was
refused), 2 bad usage (flags, JSON, no token), 3 no session (unreachable server, refused
connection such as 401 INVALID_TOKEN, lost session), 130 interrupted.

`serve` runs protoflask's own gevent server in this process, which suits development
and small deployments; production runs `gunicorn -k gevent wsgi:app` (README).
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

#: What `protoflask --help` shows (plain text: argparse prints it as it is).
DESCRIPTION = """\
protoflask: a real-time agent protocol server and its command-line client.

  protoflask serve --dev            run a development server (prints a ready token)
  protoflask chat                   type lines, see the replies
  protoflask call add '{"a": 2, "b": 40}'
  protoflask tools                  the server's tools and their schemas
  protoflask ping | stats

Run `protoflask COMMAND --help` for a command's options."""

EPILOG = """\
exit codes: 0 success, 1 the server answered with an error, 2 bad usage,
3 no session (unreachable, refused, lost), 130 interrupted"""

#: The next steps `serve --dev` prints, the same as the README's quickstart.
DEV_HINTS = ("protoflask chat", "protoflask call add '{\"a\": 2, \"b\": 40}'",
             "protoflask tools", "protoflask ping", "protoflask stats")


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


def _dev_url() -> str | None:
    """The URL of the server whose `serve --dev` token is saved (the client commands'
    default when neither --url nor PROTOFLASK_URL is given)."""
    try:
        saved = json.loads(dev_token_file().read_text())
    except (OSError, ValueError):
        return None
    url = saved.get("url") if isinstance(saved, dict) else None
    return url if isinstance(url, str) and url else None


def _default_url() -> tuple[str, str]:
    """The client commands' URL when --url is not given, and where it came from."""
    if os.environ.get("PROTOFLASK_URL"):
        return os.environ["PROTOFLASK_URL"], "from PROTOFLASK_URL"
    dev = _dev_url()
    if dev:
        return dev, (f"saved by `protoflask serve --dev` in {dev_token_file()}: is that "
                     "server still running?")
    return DEFAULT_URL, "the default; pass --url or set PROTOFLASK_URL"


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


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per row of config.OPTIONS / FLOW_OPTIONS, so they cannot drift apart."""
    from .config import FLOW_OPTIONS, OPTIONS

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
        if not os.environ.get("HOST"):  # a development server is not for the network
            config.setdefault("host", "127.0.0.1")
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
        # The token appears once (a token in a URL ends up in histories and logs).
        lines = ["development mode: a random secret and a token for user 'dev':",
                 f"export PROTOFLASK_TOKEN={token}",
                 f"dashboard and playground: {base}/  (paste the token there)"]
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
            print(f"connected to {args.url} over {args.transport} (session "
                  f"{client.session_id}); type a message and Enter, Ctrl-D to quit",
                  file=sys.stderr)
        while True:
            if interactive:  # the prompt; replies come on stdout as "agent> ..."
                sys.stderr.write("you> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                if interactive:
                    sys.stderr.write("\n")
                break
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


class _ProgressBar:
    """TOOL_UPDATE on stderr: a bar redrawn in place on a terminal, a line each otherwise;
    `finish` draws the end state (100% done, or how the call ended)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.shown = False

    @staticmethod
    def _bar(progress: float) -> str:
        filled = int(max(0.0, min(100.0, progress)) / 5)
        return f"[{'#' * filled}{'.' * (20 - filled)}] {progress:5.1f}%"

    def _write(self, line: str, end: str = "") -> None:
        self.shown = True
        if self.tty:
            sys.stderr.write("\r\033[K" + line + end)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def __call__(self, progress: float | None, status: str, partial: Any) -> None:
        if progress is None:
            self._write(f"{status.lower():<8}")
        else:
            self._write(self._bar(progress))

    def finish(self, outcome: str) -> None:
        """`done` draws a full bar; anything else (failed, cancelled) ends the bar with
        that word. Nothing is drawn for a call that never reported progress."""
        if not self.shown:
            return
        self._write(self._bar(100.0) + " done" if outcome == "done" else outcome, end="\n")


def _call(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise UsageError(f"params are not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise UsageError("params must be a JSON object, e.g. '{\"a\": 1}'")
    bar = _ProgressBar()
    with _client(args) as client:
        try:
            result = client.call_tool(args.tool, params, on_progress=bar,
                                      timeout=args.call_timeout)
        except Exception as exc:
            code = getattr(exc, "code", "")
            bar.finish("cancelled" if code == "CANCELLED" else "failed")
            raise
        bar.finish("done")
    print(json.dumps(result, indent=2 if sys.stdout.isatty() else None))
    return 0


def _tools(args: argparse.Namespace) -> int:
    """TOOL_LIST over the protocol: what a client of this server may call."""
    with _client(args) as client:
        tools = client.list_tools(timeout=args.timeout)
    tools = sorted(tools, key=lambda t: str(t.get("name", "")))
    if args.json:
        print(json.dumps(tools, indent=2))
        return 0
    for n, tool in enumerate(tools):
        if n:
            print()
        print(f"{tool.get('name')}: {tool.get('description') or ''}".rstrip())
        for label, key in (("input", "inputSchema"), ("output", "outputSchema")):
            schema = tool.get(key)
            if schema:
                print(f"  {label}: {json.dumps(schema, sort_keys=False)}")
    if not tools:
        print("(the server has no tools)")
    return 0


def _duration(ms: float) -> str:
    seconds = int(ms // 1000)
    if seconds < 60:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    shown = [f"{v} {unit}" for v, unit in parts if v]
    return " ".join(shown[:3])


#: /stats fields, how each is shown, and its unit (the JSON's own units: ms, ratios).
_STAT_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("activeConnections", "active connections", lambda v: f"{v}"),
    ("totalConnections", "connections since start", lambda v: f"{v}"),
    ("totalMessages", "messages received", lambda v: f"{v}"),
    ("messagesPerSecond", "message rate", lambda v: f"{v:.1f} msg/s"),
    ("averageLatency", "average latency", lambda v: f"{v:.2f} ms"),
    ("errorRate", "error rate", lambda v: f"{v * 100:.2f} %"),
    ("uptime", "uptime", lambda v: _duration(v)),
)


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
    stats = json.loads(body)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{args.url}/stats")
    for key, label, show in _STAT_ROWS:
        if isinstance(stats.get(key), (int, float)):
            print(f"  {label + ':':<25}{show(stats[key])}")
    nodes = stats.get("nodes")
    if isinstance(nodes, list) and nodes:
        print(f"  {'nodes:':<25}{len(nodes)} (figures above are cluster-wide)")
        for node in nodes:
            if isinstance(node, dict):
                print(f"    {node.get('node')}: {node.get('activeConnections')} active "
                      f"connections, {node.get('messagesPerSecond') or 0:.1f} msg/s")
    return 0


# -- the parser ---------------------------------------------------------------------------------


def _command(sub: Any, name: str, summary: str, description: str,
             parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """A subcommand with a one-line summary (in `protoflask --help`) and a description
    (first in `protoflask NAME --help`)."""
    return sub.add_parser(name, help=summary, description=description, parents=list(parents),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protoflask", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")

    serve = _command(sub, "serve", "run the server",
                     "Run protoflask's own gevent server in this process (production runs "
                     "gunicorn -k gevent wsgi:app).\nEach option below overrides its "
                     "environment variable; the secret comes only from JWT_SECRET.")
    serve.add_argument("--dev", action="store_true",
                       help="development mode: a random secret, 127.0.0.1 unless --host or "
                            "HOST is given, and a ready token, printed and saved for the "
                            "client commands")
    _add_config_flags(serve)
    serve.set_defaults(run=_serve)

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
    token.set_defaults(run=_token)

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
    ping.set_defaults(run=_ping)

    chat = _command(sub, "chat", "send lines as texts, print the replies",
                    "On a terminal: prompts `you> `, sends each line as a text and waits for "
                    "the reply.\nWith piped input: sends every line, prints the replies, "
                    "exits once they are in.", common)
    chat.add_argument("--wait", type=float, default=5.0,
                      help="seconds to wait for a reply (default: 5)")
    chat.set_defaults(run=_chat)

    call = _command(sub, "call", "call a tool",
                    "Call a tool: progress on stderr, the result as JSON on stdout; a "
                    "refused call prints\nthe error code and the reasons (e.g. which "
                    "params fail the tool's inputSchema).", common)
    call.add_argument("tool", help="the tool's name (see `protoflask tools`)")
    call.add_argument("params", nargs="?", default="{}",
                      help="the params, a JSON object (default: {})")
    call.add_argument("--call-timeout", type=float, default=None,
                      help="seconds to wait for the result (default: no limit)")
    call.set_defaults(run=_call)

    tools = _command(sub, "tools", "list the server's tools and their schemas",
                     "List the tools this server offers (TOOL_LIST), with their input and "
                     "output schemas.", common)
    tools.add_argument("--json", action="store_true",
                       help="print the server's list as JSON")
    tools.set_defaults(run=_tools)

    stats = _command(sub, "stats", "server statistics (no token needed)",
                     "GET /stats: connections, message rate, latency, error rate, uptime "
                     "(cluster-wide when\nthe server runs on Redis).", (where,))
    stats.add_argument("--json", action="store_true", help="print the /stats JSON as it is")
    stats.set_defaults(run=_stats)
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
    args = build_parser().parse_args(argv)
    url_from = "--url"
    if getattr(args, "url", "") is None:
        args.url, url_from = _default_url()
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


if __name__ == "__main__":
    sys.exit(main())
