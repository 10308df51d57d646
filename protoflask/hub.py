"""The session registry of one process, behind one small interface.

``LocalHub`` is the seam: the session layer uses its methods, and a cluster hub
(``protoflask.cluster``) extends it with routing to other processes. The hub sits below
the session layer: what it needs of it comes down as a ``SessionHost`` (built by the
engine). The sessions it holds are ``live.LiveSession``s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .core import messages
from .core.errors import SessionNotFound
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
    #: ERROR messages sent (a cluster weighs every node's error rate with it)
    local_stats: Callable[[], dict[str, Any]]
    #: a body POSTed to another node for a session held here; the envelopes accepted
    receive_body: Callable[["LiveSession", bytes], int]
    #: act on the events an operation another node sent caused (the listen side of a
    #: cluster: what it heard is handed to the session layer here, and nowhere else)
    settle: Callable[["LiveSession"], None] = lambda live: None


# -- the hub ---------------------------------------------------------------------------------


class LocalHub:
    """Session registry + delivery of one process: every session in a dict.

    A cluster hub extends it and overrides what sharing needs; each such method here
    says what one process does instead (usually nothing)."""

    #: whether sessions are shared with other processes
    clustered = False

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}
        self._host: SessionHost | None = None

    def bind(self, host: SessionHost) -> None:
        """The session layer this hub serves (it adopts sessions another node held)."""
        self._host = host

    @property
    def host(self) -> SessionHost:
        assert self._host is not None, "hub used before the engine bound it"
        return self._host

    def set_metrics_source(self, source: Callable[[], bytes]) -> None:
        """This process's /metrics text, for a cluster to merge into every node's answer."""
        return None  # one process serves its own registry

    def ticket_store(self) -> TicketStore:
        """Where connect tickets live: in memory, or shared by every node of a cluster."""
        return MemoryTicketStore()

    def start(self) -> None:
        """The server is serving: start any background work (called in its hub)."""
        return None

    def stop(self) -> None:
        """The server stopped: end background work, leave the cluster."""
        return None

    # -- registry --------------------------------------------------------------------------

    def add(self, live: LiveSession) -> None:
        self._sessions[live.id] = live

    def get(self, session_id: str) -> LiveSession | None:
        """A session held by this process."""
        return self._sessions.get(session_id)

    def remove(self, session_id: str) -> LiveSession | None:
        """Forget a session for good (expired or closed)."""
        return self._sessions.pop(session_id, None)

    def sessions(self) -> list[LiveSession]:
        """The sessions this process holds."""
        return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def changed(self, live: LiveSession) -> None:
        """A session was attached or detached (its shared record may need updating)."""
        return None

    def persist(self, live: LiveSession) -> None:
        """Before a POSTed body is answered 202: a cluster hub returns once Redis has
        the session's state as the body left it, so a holder that dies right after
        cannot leave a 202 for messages no other node knows it received."""
        return None

    def state_changed(self, live: LiveSession) -> None:
        """The session's durable state changed with no message going out (a tool call
        opened): a cluster hub shares it soon, so a node taking the session over knows."""
        return None

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, session_id: str, op: Operation) -> bool:
        """Apply ``op`` to a session wherever it lives and return its result (True for one
        handed to another process); SessionNotFound if there is none."""
        live = self._sessions.get(session_id)
        if live is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return live.apply(op)

    def broadcast(self, out: messages.Outbound) -> int:
        """Send to every connected session; returns how many it reached in this process."""
        reached = 0
        for live in self.sessions():
            if live.core.connected:
                live.send(out)
                reached += 1
        return reached

    def forward_upstream(self, session_id: str, user_id: str, body: bytes) -> bool:
        """Hand a POSTed body to the process that holds the session; False if none does."""
        return False

    def cancel_elsewhere(self, session_id: str, call_id: str) -> None:
        """Stop a tool call that started on the node that held the session before."""
        return None

    # -- sessions moving between processes ---------------------------------------------------

    def claim(self, session_id: str, user_id: str,
              last_seq: int | None = None) -> LiveSession | None:
        """Move a session that lives elsewhere in the cluster into this process, for a
        resume from ``last_seq`` (the last seq the client has, if it said)."""
        return None

    def hand_off(self, live: LiveSession) -> None:
        """This process is stopping: a cluster keeps the session for a resume elsewhere;
        alone, it ends with the process."""
        self.remove(live.id)

    # -- reading what other processes hold ---------------------------------------------------

    def lookup(self, session_id: str) -> dict[str, Any] | None:
        """The scalar session fields (docs/PROTOCOL.md §12) of a session held by another process."""
        return None

    def sessions_elsewhere(self, user_id: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                         bool]:
        """Sessions of ``user_id`` (every user's for None) that other processes hold or
        keep, as dashboard rows (``lookup``'s fields plus ``transport``), at most
        ``limit``; and whether the search was complete (a cluster bounds its scan)."""
        return [], True

    def cluster_stats(self, local: dict[str, Any]) -> dict[str, Any]:
        """Statistics for the whole cluster, given this process's own."""
        return local

    def metrics_registry(self, local: "CollectorRegistry") -> "CollectorRegistry":
        """What /metrics serves, given this process's registry: a cluster merges every
        node's, each sample labelled with its node."""
        return local

    def health(self) -> str:
        """"ok", or "degraded" when the cluster backend is unreachable."""
        return "ok"


#: The hub's type: every hub is a LocalHub or extends it.
Hub = LocalHub
