"""The session registry of one process, behind one small interface.

``LocalHub`` is the seam: the session layer uses its methods, and a cluster hub
(``protoflask.cluster``) extends it through eight of them (start, stop, add, remove,
changed: the registry; route and publish: what goes to other processes; claim: a session
moving here), as python-socketio's managers extend its base manager through
``_publish`` / ``_listen``. What only a cluster can answer (other nodes' sessions and
figures, its health) is one optional ``ClusterView`` (``hub.view``), which the
dashboard, /stats, /health and /metrics take. The hub sits below
the session layer: what it needs of it comes down as a ``SessionHost`` (built by the
engine). The sessions it holds are ``live.LiveSession``s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .core import messages
from .core.errors import ClusterUnavailable, SessionNotFound
from .core.session import ProtocolSession, SessionSettings
from .live import LiveSession, Operation
from .tickets import MemoryTicketStore, TicketStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


@dataclass(frozen=True, slots=True)
class SessionHost:
    """What a hub may ask of the session layer above it; the engine builds it."""

    settings: SessionSettings
    #: wrap a session moved here from another process into a LiveSession of this one
    adopt: Callable[[ProtocolSession], "LiveSession"]
    close_transport: Callable[["LiveSession", int, str], None]
    #: this node's /stats figures (docs/PROTOCOL.md §10) plus ``errorsSent``, the number of
    #: ERROR messages sent (a cluster weighs every node's error rate with it): the
    #: engine's is ``Stats.figures`` (layer 1), a call down
    local_stats: Callable[[], dict[str, Any]]
    #: a body POSTed to another node for a session held here (its errors go downstream,
    #: none is raised); a cluster runs it in a greenlet of its own and waits for it
    receive_body: Callable[["LiveSession", bytes], None]
    #: act on the events an operation another node sent caused (the listen side of a
    #: cluster): a cluster runs it in a greenlet of its own (``bell.apart``), never calls it
    settle: Callable[["LiveSession"], None] = lambda live: None
    #: a session this node stopped holding (it moved to another node): what the session
    #: layer counted for it here (its memory budget) is given back now, not at a tick (the
    #: engine's is a ring: ``bell.soon``, the next turn of the loop, on a stack of its own)
    released: Callable[["LiveSession"], None] = lambda live: None


# -- what only a cluster answers ----------------------------------------------------------


class ClusterView(Protocol):
    """The cluster's figures and other nodes' sessions, for the dashboard, /stats,
    /health and /metrics; a hub of one process has none (``LocalHub.view`` is None)."""

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        """The scalar session fields (docs/PROTOCOL.md §12) of a session held by another
        process."""

    def sessions_elsewhere(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                         bool]:
        """Sessions of ``user_id`` (every user's for None) that other processes hold or
        keep, as dashboard rows (``lookup``'s fields plus ``transport``), at most
        ``limit``; and whether the search was complete (a cluster bounds its scan)."""

    def cluster_stats(self, local: dict[str, Any]) -> dict[str, Any]:
        """Statistics for the whole cluster, given this process's own."""

    def metrics_registry(self, local: "CollectorRegistry") -> "CollectorRegistry":
        """What /metrics serves, given this process's registry: every node's, each
        sample labelled with its node."""

    def health(self) -> str:
        """"ok", or "degraded" when the cluster backend is unreachable."""

    def set_metrics_source(self, source: Callable[[], bytes]) -> None:
        """This process's /metrics text, for the others to merge into their answer."""


def cluster_stats(view: ClusterView | None, local: dict[str, Any]) -> dict[str, Any]:
    """The figures /stats and the dashboard show: the cluster's, or this process's."""
    return view.cluster_stats(local) if view is not None else local


@dataclass(frozen=True, slots=True)
class Upstream:
    """A body POSTed for a session this process does not hold (``LocalHub.route``)."""

    user_id: str
    body: bytes


# -- the hub ---------------------------------------------------------------------------------


class LocalHub:
    """Session registry + delivery of one process: every session in a dict.

    A cluster hub overrides the eight methods of "the cluster seam" below, each saying
    here what one process does instead; the rest is the same on one node and many."""

    #: whether sessions are shared with other processes
    clustered = False
    #: what only a cluster answers (see ``ClusterView``); None in one process
    view: ClusterView | None = None

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}
        self._host: SessionHost | None = None
        #: where connect tickets live: in memory, or shared by every node of a cluster
        self.tickets: TicketStore = MemoryTicketStore()

    def bind(self, host: SessionHost) -> None:
        """The session layer this hub serves (it adopts sessions another node held)."""
        self._host = host

    @property
    def host(self) -> SessionHost:
        assert self._host is not None, "hub used before the engine bound it"
        return self._host

    # -- the cluster seam --------------------------------------------------------------------

    def start(self) -> None:
        """The server is serving: start any background work (called in its hub)."""
        return None

    def stop(self) -> None:
        """The server stopped: end background work, leave the cluster."""
        return None

    def add(self, live: LiveSession) -> None:
        self._sessions[live.id] = live

    def remove(self, session_id: str, keep: bool = False) -> LiveSession | None:
        """Forget a session here: for good (expired or closed), or, with ``keep``, because
        this process is stopping: a cluster keeps it for a resume elsewhere; alone, it
        ends with the process."""
        return self._sessions.pop(session_id, None)

    def changed(self, live: LiveSession) -> None:
        """A session was attached or detached (its shared record may need updating)."""
        return None

    def route(self, session_id: str, item: Operation | Upstream) -> bool:
        """Deliver to a session this process does not hold, in the process that does: an
        operation (its result; SessionNotFound when there is none) or a posted body
        (False when no process holds the session)."""
        if isinstance(item, Upstream):
            return False
        raise SessionNotFound(f"no session {session_id!r}")

    def publish(self, message: dict[str, Any]) -> None:
        """Tell every other process (a broadcast, a cancel); ClusterUnavailable when
        that cannot be done. No other process here."""
        return None

    def claim(self, session_id: str, user_id: str,
              last_seq: int | None = None) -> LiveSession | None:
        """Move a session that lives elsewhere in the cluster into this process, for a
        resume from ``last_seq`` (the last seq the client has, if it said)."""
        return None

    # -- the same on one node and many ---------------------------------------------------------

    def get(self, session_id: str) -> LiveSession | None:
        """A session held by this process."""
        return self._sessions.get(session_id)

    def sessions(self) -> list[LiveSession]:
        """The sessions this process holds."""
        return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def deliver(self, session_id: str, op: Operation) -> bool:
        """Apply ``op`` to a session wherever it lives and return its result (True for one
        handed to another process); SessionNotFound if there is none."""
        live = self._sessions.get(session_id)
        if live is None:
            return self.route(session_id, op)
        return live.apply(op)

    def send_here(self, out: messages.Outbound) -> int:
        """Send to every connected session this process holds; how many it reached."""
        reached = 0
        for live in self.sessions():
            if live.core.connected:
                live.send(out)
                reached += 1
        return reached

    def broadcast(self, out: messages.Outbound) -> int:
        """Send to every connected session; returns how many it reached in this process."""
        reached = self.send_here(out)
        if self.clustered:
            try:
                self.publish({"op": "broadcast", "out": out.to_dict()})
            except ClusterUnavailable as exc:
                raise ClusterUnavailable(
                    f"broadcast reached {reached} sessions on this node; {exc.message}, so "
                    "other nodes' sessions were not reached") from exc
        return reached

    def cancel_elsewhere(self, session_id: str, call_id: str) -> None:
        """Stop a tool call that started on the node that held the session before."""
        try:
            self.publish({"op": "cancel", "sid": session_id, "call": call_id})
        except ClusterUnavailable:
            pass  # the client has its TOOL_DONE CANCELLED already

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        """The scalar session fields (docs/PROTOCOL.md §12) of a session another process
        holds (``view.lookup``); None in one process."""
        return self.view.lookup(session_id) if self.view is not None else None


#: The hub's type: every hub is a LocalHub or extends it.
Hub = LocalHub
