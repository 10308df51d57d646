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
    from ..port import AdapterPorts, SessionPort
    from .run import AguiServices

log = logging.getLogger("protoflask.agui")

#: The run metadata key that names the handler's node.
HANDLER_NODE = "aguiHandler"
#: Seconds between two looks at a watched handler's node (the cluster beats every second).
WATCH_INTERVAL = 1.0


def handler_metadata(ports: "AdapterPorts") -> dict[str, Any] | None:
    """What a run records of its handler: its node, when clustered."""
    node = ports.node_id
    return {HANDLER_NODE: node} if node else None


class LostHandlers:
    """The watches of one server (see the module doc)."""

    def __init__(self, ports: Callable[[], "AdapterPorts"],
                 services: Callable[[], "AguiServices"]) -> None:
        self.ports = ports
        self.services = services
        self.watching: set[tuple[str, str]] = set()

    def attached(self, port: "SessionPort") -> None:
        """A transport attached here: watch the runs whose handler is on another node
        (``port``: the session's, as ``AdapterPorts.here`` gives it)."""
        ports = self.ports()
        here = ports.node_id
        if here is None:
            return
        for run_id, run in list(ports.state(port).runs.items()):
            node = run.metadata.get(HANDLER_NODE) if isinstance(run.metadata, dict) else None
            key = (port.id, run_id)
            if run.status == "active" and isinstance(node, str) and node != here \
                    and key not in self.watching:
                self.watching.add(key)
                gevent.spawn(self._watch, ports, port, run_id, node)

    def _watch(self, ports: "AdapterPorts", port: "SessionPort", run_id: str,
               node: str) -> None:
        try:
            live_nodes = ports.other_live_nodes
            state = ports.state(port)
            while live_nodes is not None:
                run = state.runs.get(run_id)
                if not ports.is_current(port) or run is None or run.status != "active":
                    return  # ended, or the session moved on (its next holder watches)
                if node not in live_nodes():
                    log.warning("session %s: the AG-UI handler of run %s was on node %s, "
                                "which was lost; ending the run", port.id, run_id, node)
                    self.services().finish_run(port.id, run_id, error={
                        "code": "INTERNAL_ERROR",
                        "message": f"the run's handler was on node {node}, which was lost"})
                    return
                gevent.sleep(WATCH_INTERVAL)
        except ProtoError:
            pass  # the run ended meanwhile, or the session expired
        except Exception:  # noqa: BLE001 - Redis unreachable: the next attach watches again
            log.exception("watching the AG-UI handler of run %s", run_id)
        finally:
            self.watching.discard((port.id, run_id))
