"""The client commands, on protoflask.client: `ping`, `chat`, `call`, `tools`, `stats`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable

from .devtoken import dev_token_for
from .usage import UsageError


def _token_for(args: argparse.Namespace) -> str:
    token = args.token or os.environ.get("PROTOFLASK_TOKEN") or dev_token_for(args.url)
    if not token:
        _check_reachable(args.url, args.timeout)  # a dead server first: the token is moot
        raise UsageError("no token: pass --token, set PROTOFLASK_TOKEN, or start the server "
                         "with `protoflask serve --dev` (its token is picked up)")
    return token


def _check_reachable(url: str, timeout: float) -> None:
    """ConnectionFailed (the CLI's "server unreachable") when nothing listens at ``url``."""
    import socket
    from urllib.parse import urlsplit

    from ..client.errors import ConnectionFailed

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    try:
        socket.create_connection((host, port), timeout=min(timeout, 3.0)).close()
    except OSError as exc:
        raise ConnectionFailed(f"cannot reach {host}:{port}: {exc.strerror or exc}") from None


def _client(args: argparse.Namespace, **options: Any) -> Any:
    from ..client import Client

    return Client(args.url, _token_for(args), transport=args.transport,
                  timeout=args.timeout, **options).connect()


def ping(args: argparse.Namespace) -> int:
    rtts: list[float] = []
    with _client(args) as client:
        print(f"PING {args.url} over {args.transport}, session {client.session_id}")
        for n in range(1, args.count + 1):
            rtt = client.ping(timeout=args.timeout) * 1000
            rtts.append(rtt)
            print(f"pong {n}: time={rtt:.2f} ms", flush=True)
            if n < args.count:
                time.sleep(args.interval)
    pongs = f"{len(rtts)} pong" + ("" if len(rtts) == 1 else "s")
    print(f"{pongs}, min/avg/max = {min(rtts):.2f}/{sum(rtts) / len(rtts):.2f}/"
          f"{max(rtts):.2f} ms")
    return 0


def chat(args: argparse.Namespace) -> int:
    """Each stdin line is sent as a text; the server's texts are printed as they stream."""
    interactive = sys.stdin.isatty()
    prefix = "agent> " if interactive else ""
    replies = threading.Semaphore(0)
    last_activity = [time.monotonic()]
    open_texts: set[str] = set()
    runs: set[str] = set()  # the server's runs in progress (a reply in a run)

    def on_message(msg: dict[str, Any]) -> None:
        last_activity[0] = time.monotonic()
        mtype, payload = msg["type"], msg["payload"]
        if mtype == "RUN_STARTED":
            runs.add(payload.get("run_id"))
        elif mtype == "RUN_FINISHED":
            runs.discard(payload.get("run_id"))
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
                try:
                    replies.acquire(timeout=args.wait)
                except KeyboardInterrupt:  # stop this reply; Ctrl-C at the prompt quits
                    _stop_reply(client, runs, open_texts)
        if not interactive:  # stdin ended: wait for the replies (until idle for --wait s)
            got = 0
            while got < sent:
                if replies.acquire(timeout=0.1):
                    got += 1
                elif time.monotonic() - last_activity[0] > args.wait:
                    break
    return 0


def _stop_reply(client: Any, runs: set[str], open_texts: set[str]) -> None:
    """Ctrl-C during a reply: cancel the runs in progress (RUN_CANCEL: the server stops
    streaming a reply of that run) and stop printing the texts still open."""
    cancelled = list(runs)  # the reader thread drops each one as its RUN_FINISHED comes
    for run_id in cancelled:
        client.send("RUN_CANCEL", "USER", {"run_id": run_id})
    open_texts.clear()
    sys.stdout.write("\n")
    sys.stdout.flush()
    what = f"{len(cancelled)} run(s) cancelled" if cancelled else "reply no longer shown"
    print(f"^C: {what}; Ctrl-C again at the prompt quits", file=sys.stderr)


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
        line = f"{status.lower():<8}" if progress is None else self._bar(progress)
        if partial is not None:  # what the tool has so far
            shown = json.dumps(partial)
            if self.tty and len(shown) > 60:  # one terminal line, redrawn in place
                shown = shown[:59] + "…"
            line += f"  partial: {shown}"
        self._write(line)

    def finish(self, outcome: str) -> None:
        """`done` draws a full bar; anything else (failed, cancelled) ends the bar with
        that word. Nothing is drawn for a call that never reported progress."""
        if not self.shown:
            return
        self._write(self._bar(100.0) + " done" if outcome == "done" else outcome, end="\n")


def call(args: argparse.Namespace) -> int:
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


def tools(args: argparse.Namespace) -> int:
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


def stats(args: argparse.Namespace) -> int:
    from ..client.stats import get_stats

    stats = get_stats(args.url, args.timeout)
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
