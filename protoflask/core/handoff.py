"""What a session carries from one node to another: its durable state as plain data, and
a session rebuilt from that state plus its replay entries.

A cluster keeps this next to the session's replay window so that any node can take the
session over (a resume that lands elsewhere, or a node that died). What does not move:
the transport (the client reconnects) and a node's tool executions (they keep running
where they started and report through the cluster). Texts still being assembled move
when the session is handed over (``texts``): the old node accepted their START and PARTs,
so the client will not send them again, and the rest of a text may reach the new node.

Each part exports and restores itself (the credit ledger, the runs and calls, the
outbound queue); this module only names the fields of the state and its version.
"""

from __future__ import annotations

from sys import getsizeof
from typing import Any, Iterable

from .errors import ReplayUnavailable
from .messages import error as error_message
from .seen import SeenSeqs
from .session import ProtocolSession
from .settings import SessionSettings
from .upstream import Text

STATE_VERSION = 1


def export_state(session: ProtocolSession, texts: bool = False) -> dict[str, Any]:
    """The session's durable state as JSON-ready data; with ``texts``, the client's open
    texts too (their parts so far: up to maxTextSize each, so only when the session
    moves, not in every copy a cluster keeps, which would write a text again with each
    of its parts)."""
    # a cluster exports this for every session in every journal batch: the parts read
    # directly rather than through the session's views of them
    runs, calls = session.registry.export()
    outbound = session.outbound
    paused = outbound.paused_by_client
    state: dict[str, Any] = {
        "v": STATE_VERSION,
        "id": session.id,
        "user": session.user_id,
        "handshake": session.handshake_completed,
        "last_activity": session.last_activity,
        "upstream_seq": session.up_seqs.highest,
        "upstream_missing": session.up_seqs.missing(),
        "downstream_seq": outbound.downstream_seq,
        "last_ack": session.last_ack,
        "accept_events": sorted(session.accept_events) if session.accept_events else None,
        "extensions": sorted(session.extensions) if session.extensions else None,
        "paused_by_client": sorted(paused) if paused else [],
        "counter": session.id_counter,
        "credits": session.credits.export(),
        "runs": runs,
        "calls": calls,
    }
    if texts and session.texts:
        # [message_id, content_type, the parts so far as one string, their UTF-8 size]
        state["texts"] = [[mid, text.content_type, "".join(text.parts), text.size]
                          for mid, text in session.texts.items()]
    return state


def pending_outbound(session: ProtocolSession) -> list[dict[str, Any]]:
    """Messages queued but not yet stamped (waiting for credit or a pause): they move with
    the session and are sent, in order, by the node that takes it over."""
    return session.outbound.export_pending()


def restore(state: dict[str, Any], settings: SessionSettings, now: int,
            replay: Iterable[tuple[int, int, bytes]] = ()) -> ProtocolSession:
    """A detached session equal to the exported one, with ``replay``'s (seq, stored_at,
    data) entries in its window; attach it to resume from a client's last_seq."""
    session = ProtocolSession(state["id"], state["user"], settings, now,
                              greeted=bool(state["handshake"]))
    session.last_activity = int(state["last_activity"])
    # absent in a state exported before out-of-order seqs: everything below counts as seen
    session.up_seqs = SeenSeqs(int(state["upstream_seq"]), state.get("upstream_missing") or ())
    session.last_ack = int(state["last_ack"])
    accept = state.get("accept_events")
    session.accept_events = frozenset(accept) if accept else None
    session.extensions = frozenset(state.get("extensions") or ())
    session.id_counter = int(state.get("counter") or 0)
    saved = state.get("credits")
    if saved:
        session.credits.restore(saved)
    session.registry.restore(state.get("runs"), state.get("calls"))
    for mid, content_type, so_far, size in state.get("texts") or ():
        # charged to this session's meter here (its user's account takes it over when
        # the session is bound on this node), as each part was on the old node
        memory = getsizeof(so_far) if so_far else 0
        session.texts[mid] = Text(content_type, [so_far] if so_far else [], int(size), memory)
        session.meter.charge(memory)
    session.outbound.restore(int(state["downstream_seq"]),
                             set(state.get("paused_by_client") or ()), replay,
                             session.last_ack, now)
    return session


def continue_after(session: ProtocolSession, seen: int) -> bool:
    """A session restored from a copy older than what its client has seen (its node died
    while Redis could not take its writes): go on numbering after ``seen``, the client's
    resume point, so no seq is ever used twice, and declare the loss: an ERROR
    REPLAY_UNAVAILABLE, the first message after ``seen``, says that whatever the previous
    node sent after ``seen`` cannot be replayed. Call it before anything else is sent;
    False (nothing done) when the copy is not behind the client."""
    known = session.outbound.downstream_seq
    if seen <= known:
        return False
    session.outbound.downstream_seq = seen
    session.send(error_message(ReplayUnavailable(
        f"this session was restored from a copy up to seq {known}, older than the "
        f"client's seq {seen}: what its previous node sent after seq {seen} is lost",
        detail={"first_available": str(seen + 1), "restored_seq": str(known)})))
    return True
