"""What a session carries from one node to another: its durable state as plain data, and
a session rebuilt from that state plus its replay entries.

A cluster keeps this next to the session's replay window so that any node can take the
session over (a resume that lands elsewhere, or a node that died). What does not move:
the transport (the client reconnects), texts still being assembled (their parts are
dropped with the old node), and a node's tool executions (they keep running where they
started and report through the cluster).
"""

from __future__ import annotations

from typing import Any, Iterable

from . import messages
from .credits import _Account
from .seen import SeenSeqs
from .session import ProtocolSession, Run, SessionSettings, _Call

STATE_VERSION = 1


def export_state(session: ProtocolSession) -> dict[str, Any]:
    """The session's durable state as JSON-ready data."""
    credits = session.credits
    return {
        "v": STATE_VERSION,
        "id": session.id,
        "user": session.user_id,
        "handshake": session.handshake_completed,
        "last_activity": session.last_activity,
        "upstream_seq": session.upstream_seq,
        "upstream_missing": session.up_seqs.missing(),
        "downstream_seq": session.downstream_seq,
        "last_ack": session.last_ack,
        "accept_events": sorted(session.accept_events) if session.accept_events else None,
        "paused_by_client": sorted(session.paused_by_client),
        "counter": session._counter,
        "credits": {
            "grant": credits.grant,
            "downstream": credits.downstream_enabled,
            "down_default": [credits._down_messages, credits._down_bytes],
            "up": {ch: [a.messages, a.bytes] for ch, a in credits._up.items()},
            "down": {ch: [a.messages, a.bytes] for ch, a in credits._down.items()},
        },
        "runs": [[r.run_id, r.start_time, r.thread_id, r.metadata] for r in session.runs.values()],
        "calls": {cid: [c.run_id, c.message_id] for cid, c in session.calls.items()},
    }


def pending_outbound(session: ProtocolSession) -> list[dict[str, Any]]:
    """Messages queued but not yet stamped (waiting for credit or a pause): they move with
    the session and are sent, in order, by the node that takes it over."""
    return [ob.to_dict() for ob in session.pending]


def restore(state: dict[str, Any], settings: SessionSettings, now: int,
            replay: Iterable[tuple[int, int, bytes]] = ()) -> ProtocolSession:
    """A detached session equal to the exported one, with ``replay``'s (seq, stored_at,
    data) entries in its window; attach it to resume from a client's last_seq."""
    session = ProtocolSession(state["id"], state["user"], settings, now)
    session.handshake_completed = bool(state["handshake"])
    session.last_activity = int(state["last_activity"])
    # absent in a state exported before out-of-order seqs: everything below counts as seen
    session.up_seqs = SeenSeqs(int(state["upstream_seq"]), state.get("upstream_missing") or ())
    session.last_ack = int(state["last_ack"])
    accept = state.get("accept_events")
    session.accept_events = frozenset(accept) if accept else None
    session.paused_by_client = set(state.get("paused_by_client") or ())
    session._counter = int(state.get("counter") or 0)

    credits, saved = session.credits, state.get("credits") or {}
    if saved:
        credits.grant = int(saved["grant"])
        # absent in a state exported before downstream credit was opt-in: not counting
        # never stalls the client
        credits.downstream_enabled = saved.get("downstream") is True
        credits._down_messages, credits._down_bytes = saved["down_default"]
        credits._up = {ch: _Account(m, b) for ch, (m, b) in saved["up"].items()}
        credits._down = {ch: _Account(m, b) for ch, (m, b) in saved["down"].items()}

    for run_id, start_time, thread_id, metadata in state.get("runs") or ():
        session.runs[run_id] = Run(run_id, start_time, thread_id=thread_id, metadata=metadata)
    for call_id, (run_id, message_id) in (state.get("calls") or {}).items():
        session.calls[call_id] = _Call(run_id, message_id)

    downstream_seq = int(state["downstream_seq"])
    for seq, stored_at, data in replay:
        if seq > session.last_ack:
            session.replay.add(seq, data, stored_at)
        downstream_seq = max(downstream_seq, seq)
    session.downstream_seq = downstream_seq
    session.replay.prune(now)
    return session


def requeue(session: ProtocolSession, outbound: Iterable[dict[str, Any]]) -> None:
    """Queue messages that were pending on the old node, or sent while no node held it."""
    for item in outbound:
        session.send(messages.from_dict(item))
