"""The upstream half of a client session: seqs, the send queues, credit and confirmation.

Sans-I/O: the Client calls every method under its lock and does the writing.

Exactly once, upstream (docs/PROTOCOL.md §2, §8): a data message keeps its place in
``unconfirmed`` until the server has surely seen it: a 202 to the POST that carried it
(SSE, stream), the PONG to a later PING of ours (the server handles one connection's
messages in order), or a HELLO reply whose ``last_client_seq`` covers it. After a
reconnect the client sends HELLO first; the reply's ``last_client_seq`` says which
unconfirmed messages arrived, and the others are sent again **under their own seqs**:
``last_client_seq`` is only what the server had seen when it answered, and a POST cut
off by the reset may still reach it afterwards (a balancer, a proxy's retry). Sent under
its own seq, whichever copy arrives second is a retransmission the server drops (§2.2),
so a TOOL_CALL never runs twice. Only a message refused unprocessed (CHANNEL_PAUSED) is
sent again with a new seq, as §2.2 asks; and one sent so long ago that the server no
longer remembers its seq individually (``SEEN_WINDOW`` below the HELLO's) would be
dropped unprocessed, so it gets a new one.

Credit (docs/PROTOCOL.md §5 Flow control): what the client may send is counted by the
same ledger the server counts what it may send with (``core.credits.CreditLedger``, its
sending side): the HELLO reply's grants, less what was sent, plus the FLOW_UPDATEs.

Back-pressure: a message the server refused with CHANNEL_PAUSED is sent again after
RESUME_CHANNEL. Everything sent between the server's pause and our hearing of it is
refused too, so after a refusal the channel is sent in a window that starts at
``CAUTIOUS_START`` messages and doubles each time the server is known to have processed
the whole window (the PONG to a PING sent after it), until it passes ``CAUTIOUS_END``;
another refusal starts it over. This keeps a client that is paused again and again from
resending its whole queue into each pause.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from ..core.credits import CreditLedger, CreditSettings
from ..core.envelope import Message, encode
from ..core.seen import WINDOW as SEEN_WINDOW
from ._requests import Waiter

#: The window of a channel after a CHANNEL_PAUSED refusal (see the module docstring).
CAUTIOUS_START, CAUTIOUS_END = 8, 1024
#: Most messages written in one batch.
BATCH = 256
#: Without a confirmation per send (WebSocket), ask for a PONG once this many are unconfirmed.
CONFIRM_AFTER = 64
#: Sent data messages remembered by id, so that a refusal naming one can resend it.
RECENT = 1024
#: The server's defaults, when its HELLO reply names no initial credit.
DEFAULT_CREDIT = (1000, 1048576)


@dataclass
class Entry:
    """One upstream message; ``seq`` and ``data`` are set when it is written."""

    type: str
    channel: str
    payload: dict[str, Any]
    id: str
    seq: int = 0
    data: bytes = b""
    charged: bool = False
    #: sent again after a reconnect, under its own (older) seq: a HELLO reply's
    #: last_client_seq does not say whether it arrived (see the module docstring)
    resent: bool = False


def sending_ledger(enabled: bool, messages: int, nbytes: int) -> CreditLedger:
    """A ledger whose sending side holds ``messages`` / ``nbytes`` per channel; the
    receiving side's settings do not matter to a sender."""
    ledger = CreditLedger(CreditSettings(
        enabled=enabled, initial_credits=messages, min_credits=messages,
        max_credits=messages, credit_threshold=0, adaptive_adjustment=False,
        initial_credit_messages=messages, initial_credit_bytes=nbytes))
    ledger.announce_client_credit(messages, nbytes)
    return ledger


class UpstreamQueue:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._ids = itertools.count(1)
        self.seq = 0  # last upstream seq assigned
        self.control: deque[Entry] = deque()
        self.data: deque[Entry] = deque()
        self.unconfirmed: deque[Entry] = deque()
        self.recent: OrderedDict[str, Entry] = OrderedDict()  # id -> sent data entry
        self.retry: list[Entry] = []  # refused with CHANNEL_PAUSED: sent again on resume
        self.paused: set[str] = set()
        # channel -> [window, sent since the last proof, seq of the last sent] after a
        # CHANNEL_PAUSED refusal
        self.cautious: dict[str, list[int]] = {}
        self.credit = sending_ledger(True, 0, 0)  # nothing may be sent before the HELLO reply
        self.pings: dict[str, tuple[Waiter, Entry, float]] = {}  # nonce -> waiter, PING, sent
        self.confirm_ping: str | None = None

    def next_id(self, kind: str = "") -> str:
        """A fresh id for an envelope, text, call or run of this client."""
        return f"{self.prefix}-{kind}{next(self._ids)}"

    def control_message(self, type: str, payload: dict[str, Any]) -> None:
        self.control.append(Entry(type, "SYSTEM", payload, self.next_id()))

    @property
    def empty(self) -> bool:
        return not self.control and not self.data

    def hello(self, payload: dict[str, Any], session: str, now_ms: int) -> Entry:
        """The HELLO that opens a connection, written before anything else on it."""
        self.seq += 1
        hello = Entry("HELLO", "SYSTEM", payload, f"{self.prefix}-hello{self.seq}", seq=self.seq)
        hello.data = encode_entry(hello, session, now_ms)
        return hello

    def take_batch(self, session: str, confirms_on_send: bool, now_ms: int,
                   monotonic: float) -> list[Entry]:
        """The next messages to write, with their seqs: control messages first, then data
        messages while their channel has credit and is neither paused nor cautious."""
        batch: list[Entry] = []
        seq = self.seq
        while self.control:
            entry = self.control.popleft()
            seq += 1
            entry.seq, entry.data = seq, b""
            batch.append(entry)
            if entry.type == "PING" and entry.payload["nonce"] in self.pings:
                waiter = self.pings[entry.payload["nonce"]][0]
                self.pings[entry.payload["nonce"]] = (waiter, entry, monotonic)
        credit = self.credit
        while self.data and len(batch) < BATCH:
            entry = self.data[0]
            if entry.channel in self.paused:
                break
            window = self.cautious.get(entry.channel)
            if window is not None and window[1] >= window[0]:
                break  # wait until the server has surely processed the window
            # a resend keeps its seq (see the module docstring), unless the server would
            # no longer tell it from one it has seen
            again = entry.resent and entry.seq > seq - (SEEN_WINDOW - BATCH)
            if not again:
                entry.seq, entry.resent = seq + 1, False
            entry.data = encode_entry(entry, session, now_ms)
            if credit.enabled:
                if not credit.can_send(entry.channel, len(entry.data)):
                    break
                credit.spend(entry.channel, len(entry.data))
                entry.charged = True
            if not again:
                seq += 1
            if window is not None:
                window[1] += 1
                window[2] = max(window[2], entry.seq)
            self.data.popleft()
            batch.append(entry)
            self.unconfirmed.append(entry)
            self.recent[entry.id] = entry
            if len(self.recent) > RECENT:
                self.recent.popitem(last=False)
        if self.confirm_ping is None and (
                (not confirms_on_send and len(self.unconfirmed) >= CONFIRM_AFTER)
                or any(w[1] >= w[0] for w in self.cautious.values())):
            # Ask for a PONG: it proves every message before it arrived (same connection).
            nonce = self.confirm_ping = self.next_id("confirm")
            seq += 1
            entry = Entry("PING", "SYSTEM", {"nonce": nonce}, nonce, seq=seq)
            self.pings[nonce] = (Waiter(), entry, monotonic)
            batch.append(entry)
        for entry in batch:
            if not entry.data:
                entry.data = encode_entry(entry, session, now_ms)
        self.seq = seq
        return batch

    def confirm(self, seq: int) -> None:
        """The server has seen everything up to ``seq``."""
        while self.unconfirmed and self.unconfirmed[0].seq <= seq:
            self.unconfirmed.popleft()

    def proved(self, seq: int) -> bool:
        """A PONG says the server processed everything up to ``seq``, and any refusal of
        those came before it (a 202 does not: the ERRORs of a body come on the
        downstream, after it). Whether a cautious window grew."""
        grew = False
        for channel, window in list(self.cautious.items()):
            if window[1] and window[2] <= seq:  # the whole window went through
                if window[0] * 2 > CAUTIOUS_END:
                    del self.cautious[channel]
                else:
                    window[0], window[1] = window[0] * 2, 0
                grew = True
        return grew

    def refund(self, entry: Entry) -> None:
        if entry.charged:
            self.credit.add_client_credit(entry.channel, 1, len(entry.data))
            entry.charged = False

    # -- what the server said ------------------------------------------------------------------

    def on_first_hello(self, flow_control: dict[str, Any]) -> None:
        messages, nbytes = DEFAULT_CREDIT
        self.credit = sending_ledger(
            bool(flow_control.get("enabled", True)),
            int(flow_control.get("initial_credit_messages", messages)),
            int(flow_control.get("initial_credit_bytes", nbytes)))

    def on_hello(self, last_client_seq: int) -> None:
        """What the server surely saw is confirmed; the rest goes out again, first, in
        order, under its own seq. A message sent under a fresh seq at or below
        ``last_client_seq`` arrived (one batch at a time, in seq order); one that was
        itself a resend has a seq below the HELLO that preceded it, so the reply cannot
        say: it goes again (a retransmission the server drops if it has it)."""
        resend = [e for e in self.unconfirmed if e.seq > last_client_seq or e.resent]
        self.unconfirmed.clear()
        for entry in reversed(resend):
            self.refund(entry)
            entry.resent = True
            self.data.appendleft(entry)
        for window in self.cautious.values():
            window[1] = 0  # what it counted is resent (or was confirmed) above

    def on_pong(self, nonce: Any) -> tuple[tuple[Waiter, Entry, float] | None, bool]:
        """The PING it answers (None: not ours), and whether a cautious window grew."""
        ping = self.pings.get(nonce) if isinstance(nonce, str) else None
        if ping is None:
            return None, False
        entry = ping[1]
        self.confirm(entry.seq - 1)
        grew = self.proved(entry.seq - 1)
        if nonce == self.confirm_ping:
            self.confirm_ping = None
            del self.pings[nonce]
        return ping, grew

    def on_flow_update(self, p: dict[str, Any]) -> None:
        self.credit.add_client_credit(p.get("channel", ""), int(p.get("add_messages") or 0),
                                      int(p.get("add_bytes") or 0))

    def on_pause(self, channel: str) -> None:
        self.paused.add(channel)

    def on_resume(self, channel: str) -> None:
        self.paused.discard(channel)
        retry = [e for e in self.retry if e.channel == channel]
        self.retry = [e for e in self.retry if e.channel != channel]
        self.data.extendleft(reversed(retry))  # first, in their original order

    def on_refusal(self, code: str, related: Any) -> bool:
        """An ERROR about one of our data messages: whether it was a CHANNEL_PAUSED
        refusal, now queued to be sent again on RESUME_CHANNEL."""
        if code in ("CHANNEL_PAUSED", "INSUFFICIENT_CREDITS") and related in self.recent:
            # refused unprocessed, and the server charged nothing for it: neither do we
            self.refund(self.recent[related])
        if code == "CHANNEL_PAUSED" and related in self.recent:
            entry = self.recent.pop(related)
            if entry in self.unconfirmed:
                self.unconfirmed.remove(entry)
            entry.resent = False  # refused, its seq counts as seen: sent under a new one
            self.retry.append(entry)
            self.paused.add(entry.channel)
            self.cautious[entry.channel] = [CAUTIOUS_START, 0, 0]
            return True
        return False

    def on_connection_lost(self) -> None:
        """PONGs, ACKs and FLOW_UPDATEs for the old connection are stale; our PINGs are
        asked again on the next one."""
        if self.confirm_ping is not None:
            del self.pings[self.confirm_ping]
            self.confirm_ping = None
        self.control = deque(entry for _, entry, _ in self.pings.values())


def encode_entry(entry: Entry, session: str, now_ms: int) -> bytes:
    """The envelope, built and encoded as the server builds its own."""
    return encode(Message(entry.id, session, entry.seq, now_ms, entry.type, entry.channel,
                          entry.payload).to_wire())
