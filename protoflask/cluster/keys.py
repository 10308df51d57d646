"""Every Redis key and channel the cluster uses, under one prefix, and how replay entries
are packed into list items.

    {p}:nodes             zset   node id -> last beat (ms)
    {p}:node:{node}       string the node's statistics, expiring unless it beats
    {p}:metrics:{node}    string the node's /metrics text, likewise
    {p}:marker:{node}     string set every beat for a minute: gone means Redis lost our data
    {p}:s:{session}       hash   user, node (empty when no node holds it), epoch (counted
                                 up by each take-over: the fence of the holder's writes),
                                 connected,
                                 transport, state (core.handoff's JSON), calls_on (JSON
                                 call_id -> node, for open calls running elsewhere than
                                 the holder; absent when none)
    {p}:r:{session}       list   the replay window: "seq stored_at data" items
    {p}:in:{session}      list   deliveries made while no node held the session, or
                                 while its holder was not listening
    {p}:queued:{node}     set    sessions of that node with such deliveries (its beat
                                 delivers them)
    {p}:loss              string when a node last found Redis had lost data (ms; 0: never)
    {p}:claim:{session}   string the node taking the session over (a short lock)
    {p}:reply:{token}     list   one-shot answers (a node saying it released a session)
    {p}:to:{node}         channel deliveries, posted bodies and release requests for a node
    {p}:all               channel broadcasts
"""

from __future__ import annotations


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.rstrip(":")
        self.nodes = f"{self.prefix}:nodes"
        self.broadcast = f"{self.prefix}:all"
        self.loss = f"{self.prefix}:loss"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"

    def node_marker(self, node_id: str) -> str:
        return f"{self.prefix}:marker:{node_id}"

    def node_metrics(self, node_id: str) -> str:
        return f"{self.prefix}:metrics:{node_id}"

    def node_channel(self, node_id: str) -> str:
        return f"{self.prefix}:to:{node_id}"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}"

    def replay(self, session_id: str) -> str:
        return f"{self.prefix}:r:{session_id}"

    def inbox(self, session_id: str) -> str:
        return f"{self.prefix}:in:{session_id}"

    def queued_for(self, node_id: str) -> str:
        return f"{self.prefix}:queued:{node_id}"

    def claim(self, session_id: str) -> str:
        return f"{self.prefix}:claim:{session_id}"

    def reply(self, token: str) -> str:
        return f"{self.prefix}:reply:{token}"

    def all_of(self, session_id: str) -> tuple[str, str, str]:
        return self.session(session_id), self.replay(session_id), self.inbox(session_id)


#: A replay list entry: "seq stored_at data". The journal formats its entries with it
#: directly (``ENTRY % (seq, now, data)``: one call fewer per message than pack_entry).
ENTRY = b"%d %d %b"


def pack_entry(seq: int, stored_at: int, data: bytes) -> bytes:
    return ENTRY % (seq, stored_at, data)


def unpack_entry(item: bytes) -> tuple[int, int, bytes]:
    seq, stored_at, data = item.split(b" ", 2)
    return int(seq), int(stored_at), data
