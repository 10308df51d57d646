"""The downstream half of a client session: delivered seqs, the credit the client grants,
and texts assembled from MESSAGE_START / PART / END.

Sans-I/O: the Client calls every method under its lock and queues what they ask for.

The client grants credit its own way, not through the server's ledger
(``core.credits.CreditLedger``): a client has no load to adapt to, so it simply tops a
channel back up to its full grant once half is spent (docs/PROTOCOL.md §5: the receiver
decides when and how much to grant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

#: Acknowledge after this many downstream messages (and when the connection falls idle).
ACK_EVERY = 32


@dataclass
class Text:
    """A text the server streamed (MESSAGE_START / PART... / END), assembled."""

    message_id: str
    text: str
    content_type: str
    channel: str


class Downstream:
    def __init__(self, credit_messages: int, credit_bytes: int) -> None:
        self.credit_messages, self.credit_bytes = credit_messages, credit_bytes
        self.last_seq = 0  # last downstream seq delivered
        self.acked = 0  # last seq acknowledged
        self.last_data_seq = 0  # last seq of a message other than the heartbeat
        self._granted: dict[str, list[int]] = {}  # channel -> [messages, bytes] left
        self._open_texts: dict[str, tuple[str, str, list[str]]] = {}

    def deliver(self, seq: int, heartbeat: bool = False) -> bool:
        """Whether a message of ``seq`` is new; anything at or below the last delivered
        was delivered before a resume and is dropped. ``heartbeat``: a PING or PONG."""
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        if not heartbeat:
            self.last_data_seq = seq
        return True

    @property
    def ack_due(self) -> bool:
        return self.last_seq - self.acked >= ACK_EVERY

    @property
    def unacked(self) -> bool:
        """Whether an idle ACK is due: something other than the heartbeat arrived since
        the last ACK (the heartbeat alone is acknowledged along with the next messages,
        so an idle client sends nothing but its PONGs)."""
        return self.last_data_seq > self.acked

    def ack(self) -> dict[str, Any]:
        """The ACK payload for everything delivered."""
        self.acked = self.last_seq
        return {"seq": str(self.last_seq)}

    # -- the credit the client grants -----------------------------------------------------------

    def spend(self, channel: str, nbytes: int) -> dict[str, Any] | None:
        """A data message arrived: the FLOW_UPDATE payload to send once half the channel's
        grant is spent, else None."""
        left = self._granted.setdefault(channel, [self.credit_messages, self.credit_bytes])
        left[0] -= 1
        left[1] -= nbytes
        if left[0] <= self.credit_messages // 2 or left[1] <= self.credit_bytes // 2:
            update = {"channel": channel, "add_messages": self.credit_messages - left[0],
                      "add_bytes": self.credit_bytes - left[1]}
            left[0], left[1] = self.credit_messages, self.credit_bytes
            return update
        return None

    def restart_grants(self) -> None:
        """A HELLO's announcement restarts the server's count."""
        self._granted.clear()

    # -- texts ------------------------------------------------------------------------------------

    def on_text(self, mtype: str, p: dict[str, Any], channel: str,
                on_part: Callable[[str, str], None] | None) -> Text | bool:
        """MESSAGE_START / PART / END: the assembled Text at its END, else whether the
        message belonged to a text this client follows."""
        mid = p.get("message_id", "")
        if mtype == "MESSAGE_START":
            self._open_texts[mid] = (p.get("content_type", "text/plain"), channel, [])
            return True
        if mid not in self._open_texts:
            return False
        content_type, text_channel, parts = self._open_texts[mid]
        if mtype == "MESSAGE_PART":
            content = p.get("content", "")
            parts.append(content)
            if on_part is not None:
                on_part(mid, content)
            return True
        del self._open_texts[mid]
        return Text(mid, "".join(parts), content_type, text_channel)
