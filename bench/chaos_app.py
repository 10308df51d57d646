"""The app bench/cluster_chaos.py runs under gunicorn: protoflask from the environment
(REDIS_URL or REDIS_SENTINELS, JWT_SECRET) plus the issue's application tool, ``work``:
it runs ``seconds`` (2-10) and reports a TOOL_UPDATE every 0.5 s on the way, from
whichever node the call runs on to wherever its session lives by then."""

from __future__ import annotations

import logging
import os
from typing import Any

import gevent

from protoflask.logs import configure_logging
from protoflask.server import create_app

configure_logging()
if os.environ.get("CHAOS_DEBUG"):  # the soak's --debug: every move of a session, per worker
    logging.getLogger("protoflask.cluster").setLevel(logging.DEBUG)
    for handler in logging.getLogger("protoflask").handlers:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
app = create_app()
server = app.extensions["protoflask"]

UPDATE_EVERY = 0.5


@server.tool("work", input_schema={
    "type": "object", "properties": {"seconds": {"type": "number", "minimum": 0,
                                                 "maximum": 30}},
    "required": ["seconds"]})
def work(params: dict[str, Any], session_id: str, call_id: str, srv: Any) -> dict[str, Any]:
    """Works ``seconds``, saying how far it got every 0.5 s."""
    seconds = float(params["seconds"])
    steps = max(1, int(seconds / UPDATE_EVERY))
    for step in range(steps):
        gevent.sleep(seconds / steps)
        srv.send_tool_update(session_id, call_id, "RUNNING", round((step + 1) / steps, 3),
                             {"step": step + 1})
    return {"steps": steps}
