"""The dashboard and playground page (plain HTML/JS/CSS in ``protoflask/static``, no build
step) and the JSON it polls.

Routes (config ``dashboard``, on by default):

    GET /                        the page, on protoflask's own app only (an application's
                                 Flask app keeps its "/")
    GET /dashboard               the page, always
    GET /dashboard/static/<f>    its script and style sheet
    GET /dashboard/data          JSON: public aggregates; sessions and tools with a token

In a cluster (Redis), every poll may land on another worker: ``stats`` are cluster-wide
(as /stats: summed over the live nodes, with ``nodes``), and the session list includes the
user's sessions held or kept by other workers and nodes (read through the hub, from the
shared session records). ``transports``, ``history`` and ``gauges`` are the answering
worker's own; ``scope`` says which figures are whose, and ``node`` who answered.

What needs a token: the aggregates (counts, rates, history, queue depths) are as public
as /stats. The per-session list and the tool list need a valid token (Bearer or
``?token=``) and list only that user's own sessions; in development mode (``devMode``)
every session and every tool is listed without a token. A bad token is 401.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, g, request, send_from_directory

from .auth import token_from_request
from .core.errors import InvalidMessage, ProtoError
from .clock import now_ms
from .core.bodies import is_seq
from .hub import cluster_stats
from .live import LiveSession
from .metrics import session_gauges
from .transports.http import error_response, json_response

if TYPE_CHECKING:
    from .engine import Engine

STATIC_DIR = Path(__file__).resolve().parent / "static"
ROOT_PLACEHOLDER = "__PROTOFLASK_ROOT__"
MAX_LISTED_SESSIONS = 200  # the most recently active ones
MAX_SAFE_INTEGER = 2**53 - 1  # JavaScript's; orjson refuses ints past 64 bits


def add_dashboard_routes(bp: Blueprint, engine: "Engine", dev_mode: bool,
                         at_root: bool) -> None:
    """The page's routes on ``bp``; ``dev_mode`` lists every session and tool without a
    token, ``at_root`` serves the page at "/" too (protoflask's own app only)."""

    def page() -> Response:
        # The app may be mounted below a prefix: the page's URLs start from this root.
        root = html.escape(request.script_root + "/", quote=True)
        body = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
        resp = Response(body.replace(ROOT_PLACEHOLDER, root), mimetype="text/html")
        host = request.host
        resp.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; "
            f"connect-src 'self' ws://{host} wss://{host}; frame-ancestors 'none'")
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    def static(name: str) -> Response:
        return send_from_directory(STATIC_DIR, name, max_age=0)

    def data() -> Response:
        g.protoflask_quiet = True  # polled every second or two: not in the access log
        try:
            try:
                request.args.get("since")  # parses the query
            except UnicodeDecodeError:  # werkzeug raises on a query that is not UTF-8
                raise InvalidMessage("the query string is not UTF-8") from None
            token = token_from_request(request.args.get("token"),
                                       request.headers.get("Authorization"))
            user = engine.authenticate(token) if token else None
            since = request.args.get("since") or "0"
            if not is_seq(since):  # ASCII digits only: '²' passes str.isdigit, not int()
                raise InvalidMessage(f"since must be a number of ms, got {since[:40]!r}")
        except ProtoError as exc:
            return error_response(exc)
        return json_response(dashboard_data(engine, dev_mode, user, int(since)))

    if at_root:
        bp.add_url_rule("/", "dashboard_root", page)
    bp.add_url_rule("/dashboard", "dashboard", page)
    bp.add_url_rule("/dashboard/static/<path:name>", "dashboard_static", static)
    bp.add_url_rule("/dashboard/data", "dashboard_data", data)


def dashboard_data(engine: "Engine", everyone: bool, user: str | None,
                   since: int) -> dict[str, Any]:
    """What /dashboard/data answers; ``everyone``: development mode (see the module doc)."""
    stats = engine.stats
    view = engine.hub.view
    overall = cluster_stats(view, stats.snapshot(now_ms()))
    clustered = "nodes" in overall
    out: dict[str, Any] = {
        "stats": overall,
        "node": overall.get("node"),
        "scope": {"stats": "cluster" if clustered else "server",
                  "nodes": len(overall["nodes"]) if clustered else 1,
                  "transports": "node", "history": "node", "gauges": "node",
                  "sessions": "cluster" if clustered else "server"},
        "transports": {kind: {"active": stats.connections_active.get(kind, 0),
                              "opened": opened}
                       for kind, opened in sorted(stats.connections_opened.items())},
        "history": [h for h in stats.history if h[0] > since],
        "gauges": session_gauges(engine),
        "access": {"user": user, "devMode": everyone,
                   "sessions": "all" if everyone else "own" if user else "none"},
    }
    if user is None and not everyone:
        return out
    sessions = engine.hub.sessions()  # only with a token (or devMode): the list itself
    visible = sessions if everyone else [s for s in sessions if s.user_id == user]
    rows = [_session_row(s) for s in visible]
    elsewhere, complete = view.sessions_elsewhere(None if everyone else user,
                                                  MAX_LISTED_SESSIONS) \
        if view is not None else ([], True)
    for row in rows:
        row["node"] = out["node"]
    rows += elsewhere
    rows.sort(key=lambda r: r["lastActivity"], reverse=True)
    out["sessionsListed"] = len(rows)
    out["sessionsComplete"] = complete
    out["sessions"] = rows[:MAX_LISTED_SESSIONS]
    for row in out["sessions"]:  # JSON numbers a browser reads exactly; others as text
        for key, value in row.items():
            if isinstance(value, int) and not isinstance(value, bool) \
                    and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                row[key] = str(value)
    out["tools"] = [t.to_dict() for t in engine.tools]
    return out


def _session_row(live: LiveSession) -> dict[str, Any]:
    core = live.core
    transport = live.transport
    runner = live.runner
    return {
        "id": live.id,
        "userId": live.user_id,
        "transport": transport.kind if transport is not None else None,
        "connected": core.connected,
        "handshakeCompleted": core.handshake_completed,
        "lastActivity": core.last_activity,
        "lastClientSeq": core.upstream_seq,
        "lastDeliveredSeq": core.downstream_seq,
        "pendingMessages": len(core.pending),
        "outboundBytes": core.unsent_bytes,
        "activeRuns": len(core.runs),
        "toolsRunning": len(runner.running) if runner is not None else 0,
        "toolsQueued": len(runner.waiting) if runner is not None else 0,
    }
