"""An AG-UI run whose handler died with its node (a worker of a cluster killed) must not
stay active for ever with no one to end it: its client, re-attached elsewhere, would wait
for a terminal event that never comes (docs/AGUI.md, "A handler lost with its worker").

Each run records the node its handler runs on (``metadata.aguiHandler``, clustered only;
it moves with the session). The node that holds the session watches, from the moment a
transport attaches there, every active run whose handler is on another node; when that
node stops beating (the cluster's NODE_TTL), it ends the run with an error (INTERNAL_ERROR,
"... was lost"), which the client gets as its RUN_ERROR after the ENDs of what was open.
A handler on a live node goes on (the session moved: a re-attach elsewhere) and is left
alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import gevent

from ..core.errors import ProtoError

if TYPE_CHECKING:
    from ..engine import Engine
    from ..live import LiveSession
    from .run import AguiServices

log = logging.getLogger("protoflask.agui")

#: The run metadata key that names the handler's node.
HANDLER_NODE = "aguiHandler"
#: Seconds between two looks at a watched handler's node (the cluster beats every second).
WATCH_INTERVAL = 1.0


def node_of(engine: "Engine") -> str | None:
    """This process's node id in a cluster (the cluster hub's); None alone."""
    node = getattr(engine.hub, "node_id", None)
    return node if isinstance(node, str) else None


def handler_metadata(engine: "Engine") -> dict[str, Any] | None:
    """What a run records of its handler: its node, when clustered."""
    node = node_of(engine)
    return {HANDLER_NODE: node} if node else None


class LostHandlers:
    """The watches of one server (see the module doc)."""

    def __init__(self, engine: Callable[[], "Engine"],
                 services: Callable[[], "AguiServices"]) -> None:
        self.engine = engine
        self.services = services
        self.watching: set[tuple[str, str]] = set()

    def attached(self, live: "LiveSession") -> None:
        """A transport attached here: watch the runs whose handler is on another node."""
        engine = self.engine()
        here = node_of(engine)
        if here is None:
            return
        for run_id, run in list(live.core.runs.items()):
            node = run.metadata.get(HANDLER_NODE) if isinstance(run.metadata, dict) else None
            key = (live.id, run_id)
            if run.status == "active" and isinstance(node, str) and node != here \
                    and key not in self.watching:
                self.watching.add(key)
                gevent.spawn(self._watch, engine, live, run_id, node)

    def _watch(self, engine: "Engine", live: "LiveSession", run_id: str, node: str) -> None:
        try:
            live_nodes: Callable[[], list[str]] | None = \
                getattr(engine.hub.view, "other_live_nodes", None)  # (cluster/view.py)
            while live_nodes is not None:
                run = live.core.runs.get(run_id)
                if engine.hub.get(live.id) is not live or run is None \
                        or run.status != "active":
                    return  # ended, or the session moved on (its next holder watches)
                if node not in live_nodes():
                    log.warning("session %s: the AG-UI handler of run %s was on node %s, "
                                "which was lost; ending the run", live.id, run_id, node)
                    self.services().finish_run(live.id, run_id, error={
                        "code": "INTERNAL_ERROR",
                        "message": f"the run's handler was on node {node}, which was lost"})
                    return
                gevent.sleep(WATCH_INTERVAL)
        except ProtoError:
            pass  # the run ended meanwhile, or the session expired
        except Exception:  # noqa: BLE001 - Redis unreachable: the next attach watches again
            log.exception("watching the AG-UI handler of run %s", run_id)
        finally:
            self.watching.discard((live.id, run_id))
