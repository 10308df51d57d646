"""Two (or twenty) gunicorn workers, on one machine or many, sharing sessions on Redis.

Nothing in the application changes for a cluster: it uses the same ProtoServer API, and
``REDIS_URL`` makes every call work whichever worker or node runs it.

- ``POST /notify/<session_id>`` sends a message to one session, wherever it is connected;
- ``POST /announce`` broadcasts to every connected session on every node, once each;
  both take an operator's token (``Authorization: Bearer``: a token of this server whose
  user is in ``OPERATORS``, comma-separated, default ``operator``: ``protoflask token
  --user operator``); any other caller gets 401 or 403;
- the ``where`` tool reports which worker ran it (tools run where the session is held).

Run it (from the repository root; Redis on 127.0.0.1:6379):

    REDIS_URL=redis://127.0.0.1:6379/0 JWT_SECRET=change-me \\
        gunicorn -c gunicorn.conf.py -w 2 --chdir examples/cluster app:app

or the whole cluster (Redis, two nodes of two workers, a load balancer without sticky
sessions) with ``docker compose up`` in this directory; see docs/DEPLOYMENT.md.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping

from flask import Flask, jsonify, request

from protoflask import ProtoServer
from protoflask.core.errors import ProtoError


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(config or {})
    server = ProtoServer(app=app)  # REDIS_URL / PROTOFLASK_REDIS_URL: the cluster

    @server.tool("where", description="Which node and worker run this session's tools.",
                 inline=True)
    def where(params: dict[str, Any], session_id: str, *context: Any) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid()}

    operators = {u.strip() for u in os.environ.get("OPERATORS", "operator").split(",")}

    def refused_unless_operator() -> Any:
        """None for an operator's token, else the JSON refusal (401 or 403)."""
        auth = request.headers.get("Authorization", "")
        try:
            user = server.authority.verify(auth[7:] if auth.startswith("Bearer ") else None)
        except ProtoError as exc:
            return jsonify({"error": {"code": exc.code, "message": exc.message}}), \
                exc.http_status
        if user not in operators:
            return jsonify({"error": {"code": "FORBIDDEN",
                                      "message": f"{user!r} is not an operator"}}), 403
        return None

    @app.post("/notify/<session_id>")
    def notify(session_id: str):
        refused = refused_unless_operator()
        if refused is not None:
            return refused
        text = (request.get_json(silent=True) or {}).get("text", "")
        try:
            server.send_message(session_id, {"type": "NOTIFICATION", "channel": "AGENT",
                                             "payload": {"text": text, "from": os.getpid()}})
        except ProtoError as exc:
            return jsonify({"error": {"code": exc.code, "message": exc.message}}), \
                exc.http_status
        return jsonify({"sent": True, "by": os.getpid()})

    @app.post("/announce")
    def announce():
        refused = refused_unless_operator()
        if refused is not None:
            return refused
        text = (request.get_json(silent=True) or {}).get("text", "")
        reached_here = server.broadcast({"type": "ANNOUNCEMENT", "channel": "AGENT",
                                         "payload": {"text": text}})
        return jsonify({"reachedOnThisWorker": reached_here, "by": os.getpid()})

    return app


app = create_app()

if __name__ == "__main__":
    app.extensions["protoflask"].serve_forever()
