"""A session as plain data: its fields as the application reads them (``snapshot``), and
what it carries from one node to another: its durable state, and a session rebuilt from
that state plus its replay entries.

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

from typing import Any, Iterable

from .envelope import decode_json
from .errors import ReplayUnavailable
from .messages import error as error_message
from .session import ProtocolSession
from .settings import SessionSettings

STATE_VERSION = 1


def snapshot(session: ProtocolSession) -> dict[str, Any]:
    """The session fields (docs/PROTOCOL.md §12), with live values (plain data, camelCase):
    what the application reads of a session (``ProtoServer.get_session``)."""
    up = session.credits.upstream()
    ob = session.outbound
    return {
        "id": session.id,
        "userId": session.user_id,
        "connected": session.connected,
        "handshakeCompleted": session.handshake_completed,
        "lastActivity": session.last_activity,
        "credits": {ch: m for ch, (m, _) in up.items()},
        "byteCredits": {ch: b for ch, (_, b) in up.items()},
        "downstreamCredits": {ch: m for ch, (m, _) in session.credits.downstream().items()},
        "pausedChannels": set(ob.paused_by_client | ob.paused_by_server),
        "lastAck": str(session.last_ack),
        "lastDeliveredSeq": str(ob.downstream_seq),
        "lastClientSeq": str(session.upstream_seq),
        "replayWindow": {str(e.seq): decode_json(e.data) for e in ob.replay},
        "activeRuns": set(session.runs),
        "pendingMessages": {str(i): o.to_dict() for i, o in enumerate(ob.pending)},
        "outboundBytes": ob.unsent_bytes,
    }


def export_state(session: ProtocolSession, texts: bool = False) -> dict[str, Any]:
    """The session's durable state as JSON-ready data; with ``texts``, the client's open
    texts too (their parts so far: up to maxTextSize each, so only when the session
    moves, not in every copy a cluster keeps, which would write a text again with each
    of its parts)."""
    # a cluster exports this for every session in every journal batch: the parts read
    # directly rather than through the session's views of them
    runs, calls = session.export_work()
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
    if texts and session.has_texts():
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
    session.remember(int(state["upstream_seq"]), state.get("upstream_missing") or ())
    session.last_ack = int(state["last_ack"])
    accept = state.get("accept_events")
    session.accept_events = frozenset(accept) if accept else None
    session.extensions = frozenset(state.get("extensions") or ())
    session.id_counter = int(state.get("counter") or 0)
    saved = state.get("credits")
    if saved:
        session.credits.restore(saved)
    if state.get("runs") or state.get("calls"):  # (else none made: parts.py)
        session.registry.restore(state.get("runs"), state.get("calls"))
    for mid, content_type, so_far, size in state.get("texts") or ():
        session.texts.restore(mid, content_type, so_far, int(size))
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
