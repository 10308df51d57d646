"""Tool calls that run on another node than the one holding their session.

Tool calls belong to the node that runs them. A session taken over from a node that is
gone ends each call that was running there with one TOOL_DONE ERROR
(TOOL_EXECUTION_ERROR, "node ... was lost"), which frees its call_id; a call still
running on a live node is watched every beat and ended the same way if that node dies
before it reports. A session that moved away while calls of its still run here keeps
being followed here (``moved_away``) so a cancel reaches those calls.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..core.errors import ToolExecutionError
from ..live import LiveSession
from .store import RedisStore

log = logging.getLogger("protoflask.cluster")


class RemoteCalls:
    def __init__(self, store: RedisStore, held: Callable[[str], LiveSession | None],
                 cancel_elsewhere: Callable[[str, str], None]) -> None:
        self.store = store
        self.node_id = store.node_id
        self.held = held  # the session if this node holds it
        self.cancel_elsewhere = cancel_elsewhere
        #: sessions that moved to another node while tools of theirs still run here
        self.moved_away: dict[str, LiveSession] = {}
        #: sessions held here with calls that run on another (live) node: sid -> {call_id:
        #: node}; stored in the record's calls_on, watched every beat
        self.remote: dict[str, dict[str, str]] = {}

    def adopt(self, live: LiveSession, holder: str, runs_on: dict[str, str]) -> None:
        """A session just taken over: each of its open calls runs on the node that
        ``runs_on`` names, else on its last holder. Calls of a node that is gone end now;
        those of a live node are watched (``watch``) until they report."""
        watched: dict[str, str] = {}
        orphans: dict[str, str] = {}
        alive: dict[str, bool] = {}
        moved = self.moved_away.get(live.id)
        for call_id in list(live.core.calls):
            node = runs_on.get(call_id) or holder
            if node == self.node_id:
                if moved is not None and moved.runner is not None \
                        and call_id in moved.runner.executions:
                    continue  # back where it runs: it reports here (the moved session's link)
                orphans[call_id] = node  # this node ran it before a restart of its own
            elif node and alive.setdefault(node, self.store.node_alive(node)):
                watched[call_id] = node
            else:
                orphans[call_id] = node
        self.remote.pop(live.id, None)
        if watched:
            self.remote[live.id] = watched
        if watched or runs_on:
            self.store.set_calls_on(live.id, watched)
        for call_id, node in orphans.items():
            self.end_orphan(live, call_id, node)

    def end_orphan(self, live: LiveSession, call_id: str, node: str) -> None:
        """The call's node is gone: its one TOOL_DONE (ERROR), which frees its call_id."""
        log.warning("session %s: tool call %s was running on node %s, which was lost; "
                    "ending it", live.id, call_id, node or "(unknown)")
        live.fail_call(call_id, ToolExecutionError(
            f"tool call {call_id!r} was running on node {node or '(unknown)'}, which was "
            "lost; it will not finish"))
        self.cancel_elsewhere(live.id, call_id)  # should that node be alive after all

    def settle(self, session_id: str) -> None:
        """Forget watched calls that have ended."""
        watched = self.remote.get(session_id)
        if watched is None:
            return
        live = self.held(session_id)
        if live is None:
            del self.remote[session_id]
            return
        ended = [cid for cid in watched if cid not in live.core.calls]
        for cid in ended:
            del watched[cid]
        if not watched:
            del self.remote[session_id]
        if ended:
            self.store.set_calls_on(session_id, watched)

    def watch(self) -> None:
        """Every beat: end the watched calls whose node died before they reported."""
        alive: dict[str, bool] = {}
        for sid in list(self.remote):
            self.settle(sid)
            watched = self.remote.get(sid)
            live = self.held(sid)
            if not watched or live is None:
                continue
            dead = {cid: node for cid, node in watched.items()
                    if not alive.setdefault(node, self.store.node_alive(node))}
            if dead:
                for cid, node in dead.items():
                    self.end_orphan(live, cid, node)
                self.settle(sid)

    def let_go(self, live: LiveSession) -> dict[str, str]:
        """The session leaves this node: where each of its open calls runs (here, unless
        it was watched running elsewhere), for its next holder."""
        remote = self.remote.pop(live.id, {})
        return {cid: remote.get(cid, self.node_id) for cid in live.core.calls}

    def moved(self, live: LiveSession) -> None:
        """The session moved to another node: calls still running here report there,
        and a cancel from there reaches them."""
        if live.runner is not None and live.runner.executions:
            self.moved_away[live.id] = live

    def cancel(self, session_id: str, call_id: str) -> None:
        """The session's new holder cancelled a call that runs here."""
        live = self.moved_away.get(session_id)
        if live is not None and live.runner is not None:
            live.runner.cancel(call_id)  # its TOOL_DONE is a no-op at the new node

    def forget_finished_moves(self) -> None:
        for sid, live in list(self.moved_away.items()):
            if live.runner is None or not live.runner.executions:
                del self.moved_away[sid]
