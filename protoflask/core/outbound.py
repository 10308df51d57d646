"""One session's way down to its client: the pending queue, credit gating, seq stamping,
the replay window and resends, and back-pressure.

A message is filtered (by the session) when queued, then waits in the pending queue
until its channel has credit and is not paused; only then does it get the next
downstream seq and enter the replay window, so wire order is seq order. Control
messages never wait for credit or a pause.
"""

from __future__ import annotations

from typing import AbstractSet, Any, Callable

from orjson import dumps

from .messages import Outbound, pause_channel, resume_channel
from .credits import CreditLedger
from .envelope import CONTROL_TYPES, ENCODING
from .errors import ReplayUnavailable
from .events import Event, SendRefused, SlowConsumer
from .meter import Meter
from .replay import NO_RESENDS, ReplayWindow, ResendQueue, shared
from .settings import SessionSettings
from .traffic import TrafficCounters

# Bytes a stamped envelope adds around its payload (id, session, seq, ts, type, channel):
# the estimate the pending queue's byte count uses before the real encoding exists.
ENVELOPE_OVERHEAD = 160
#: Most bytes of replayed messages one ``take_writable`` returns: a replay is written out a
#: batch at a time, read from the window as it goes, never materialised whole.
REPLAY_BATCH_BYTES = 262144


class OutboundQueue:
    """Everything the session holds for its client, and the order it goes out in.

    ``events`` is the session's event buffer (SlowConsumer and SendRefused go there);
    ``connected`` tells whether a transport is attached."""

    def __init__(self, session_id: str, settings: SessionSettings, credits: CreditLedger,
                 traffic: TrafficCounters, events: list[Event],
                 connected: Callable[[], bool]) -> None:
        self.session_id = session_id
        self.settings = settings
        self.credits = credits
        self.traffic = traffic
        self._events = events
        self._connected = connected
        self.replay = ReplayWindow(settings.replay_window_size, settings.replay_window_time,
                                   settings.replay_window_bytes, session_id)
        self.downstream_seq = 0
        # the channels paused, each a set made on the first pause (an empty set costs 216
        # bytes an idle session, issue 29): change them with pause / resume
        self.paused_by_client: AbstractSet[str] = _NONE
        self.paused_by_server: AbstractSet[str] = _NONE
        # Lists, not deques: take_writable drains them whole. Empty, both are the shared
        # empty tuple (an idle session keeps no list of its own, and no take remakes two
        # empty lists): the first message queued makes them (``_put``).
        self.pending: list[Outbound] = _EMPTY
        self._pending_sizes: list[int] = _EMPTY
        # estimated encoded size of what ``pending`` holds, per channel
        self._pending_channel_bytes: dict[str, int] = {}
        self._pending_bytes = 0  # their sum, read for every message
        self.in_flight = 0  # bytes the transport is writing right now
        # the queue is full at this many (estimated) bytes, or at max_pending_messages
        self._full_bytes = max(settings.outbound_buffer_size, 4 * settings.max_message_size)
        # below this nothing in check_pressure can trigger (half the pause threshold)
        self._low_water = min(settings.outbound_buffer_size * settings.back_pressure_threshold / 2,
                              settings.outbound_buffer_size)
        # back-pressure may pause USER only after data was queued since the last resume
        self._pause_armed = True
        self._overflowed = False  # SlowConsumer reported for this connection
        self._resend = NO_RESENDS  # window ranges to write again (resume, REPLAY_REQUEST)
        self._resend_bytes = 0  # what they hold; counts toward the outbound buffer
        #: the session's meter: what is queued is checked against its user's budget and
        #: counted at once, with what the window evicted since (``_metered``)
        self.meter: Meter | None = None

    # -- a transport comes and goes -------------------------------------------------------

    def drop_resends(self) -> None:
        """A replay in progress was for the connection that went; a resume asks for its own."""
        self._resend.clear()
        self._resend_bytes = 0

    def let_go(self) -> None:
        """The session is closed for good: what it holds (its window, its queue) goes now,
        not when the cycles of its last connection are next collected, a full collection
        a serving worker makes rare (``serving.SERVING_GC_THRESHOLDS``). Nothing reads it
        again: a closed session sends and replays nothing."""
        self.take_pending()
        last = self.replay.last_seq
        if last is not None:
            self.replay.ack(last)
        self.drop_resends()

    # -- queueing -------------------------------------------------------------------------

    def push_plain(self, out: Outbound) -> bool:
        """Queue a message the session accepted; False when the queue is full.

        The definition. ``push_fast`` does the same with ``_enqueue`` and
        ``check_pressure``'s first test written out (about 1% of a PING's whole cost:
        bench/instructions.py); ``push`` below is the one the session uses.
        tests/core/test_outbound.py's TestPush runs over both.

        A data message that would take the session's user over their memory budget is
        refused as a full queue's is (``Meter.queue``: the reason in SendRefused)."""
        if len(self.pending) >= self.settings.max_pending_messages or \
                self._pending_bytes >= self._full_bytes:
            if not self._queued_when_full(out):
                return False
        size = len(dumps(out.payload, option=ENCODING)) + ENVELOPE_OVERHEAD
        if out.type not in CONTROL_TYPES and self.meter is not None \
                and not self._metered(out, size):
            return False
        self._enqueue(out)
        if out.type not in CONTROL_TYPES:
            self._pause_armed = True
        self.check_pressure()
        return True

    def _metered(self, out: Outbound, size: int) -> bool:
        """A data message: the user's count of windows and unsent bytes brought up to
        date with this session's (evictions taken off, control messages queued since
        added) and grown by ``size``; False, and SendRefused, if that would take the
        user or the worker over budget. (Control messages are never refused, and the
        next data message or the tick counts them: no call for every PONG.)"""
        assert self.meter is not None
        why = self.meter.queue(self.replay.nbytes + self.unsent_bytes, size, True)
        if why is None:
            return True
        self._events.append(SendRefused(out.type, out.channel, why))
        return False

    def _queued_when_full(self, out: Outbound) -> bool:
        """The queue is full: whether ``out`` is queued anyway (a control message)."""
        if out.type not in CONTROL_TYPES:
            self._events.append(SendRefused(out.type, out.channel))
            return False
        # Control messages never wait for credit, so they are queued anyway; they only
        # pile up while a write is blocked, i.e. the client does not read: that is a slow
        # consumer (its transport is closed, the session kept, and what is queued goes to
        # the replay window), so nothing is lost.
        if self._connected() and self.in_flight and not self._overflowed:
            self._overflowed = True
            self._events.append(SlowConsumer(self.unsent_bytes))
        return True

    def push_fast(self, out: Outbound) -> bool:
        """``push_plain`` with ``_enqueue``, ``_metered`` (``Meter.queue`` in it: every
        TOOL_DONE) and ``check_pressure``'s first test inline."""
        pending = self.pending
        if len(pending) >= self.settings.max_pending_messages or \
                self._pending_bytes >= self._full_bytes:
            if not self._queued_when_full(out):
                return False
        size = len(dumps(out.payload, option=ENCODING)) + ENVELOPE_OVERHEAD
        data = out.type not in CONTROL_TYPES
        pending_bytes = self._pending_bytes
        meter = self.meter
        if data and meter is not None:  # _metered, inline, and Meter.queue's slice in it
            window = self.replay.nbytes + pending_bytes + self._resend_bytes + self.in_flight
            left = meter.spare - (window + size - meter.window)
            if 0 < left <= meter.cap:  # within the slice its account lent: no call
                meter.spare = left
                meter.window = window + size
            else:
                why = meter.queue(window, size, True)
                if why is not None:
                    self._events.append(SendRefused(out.type, out.channel, why))
                    return False
        # _enqueue, inline
        if pending:
            pending.append(out)
            self._pending_sizes.append(size)
        else:  # the queue's lists, made with its first message
            self.pending, self._pending_sizes = [out], [size]
        by_channel = self._pending_channel_bytes
        channel = out.channel
        by_channel[channel] = by_channel.get(channel, 0) + size
        pending_bytes = self._pending_bytes = pending_bytes + size
        if data:
            self._pause_armed = True
        if pending_bytes + self._resend_bytes + self.in_flight >= self._low_water \
                or self.paused_by_server:  # check_pressure's own first test, saving a call
            self.check_pressure()
        return True

    #: The swap point: the implementation the session calls.
    push = push_fast

    def _enqueue(self, out: Outbound) -> None:
        # the payload's encoded size (as take_writable encodes it) plus the envelope's
        size = len(dumps(out.payload, option=ENCODING)) + ENVELOPE_OVERHEAD
        self._put(out, size)
        by_channel = self._pending_channel_bytes
        by_channel[out.channel] = by_channel.get(out.channel, 0) + size
        self._pending_bytes += size

    def _put(self, out: Outbound, size: int) -> None:
        """Append to the queue (its lists made with the first message)."""
        if self.pending:
            self.pending.append(out)
            self._pending_sizes.append(size)
        else:
            self.pending, self._pending_sizes = [out], [size]

    @property
    def pending_bytes(self) -> int:
        """Estimated encoded size of everything in ``pending`` (at most five channels)."""
        return self._pending_bytes

    @property
    def unsent_bytes(self) -> int:
        """What the session holds for its client: queued, replays still to write, and
        being written."""
        return self._pending_bytes + self._resend_bytes + self.in_flight

    def under_load(self) -> bool:
        return bool(self.paused_by_server) or \
            len(self.pending) > self.settings.max_pending_messages // 2

    # -- back-pressure --------------------------------------------------------------------

    def set_in_flight(self, nbytes: int) -> None:
        """The transport reports how many bytes it is writing (0 once written)."""
        self.in_flight = nbytes
        self.check_pressure(writer=True)

    def written(self) -> None:
        """The transport wrote what it took at once, never in flight: the resume a write
        ending would decide (below) is decided now."""
        if self.paused_by_server:
            self.check_pressure(writer=True)

    def check_pressure(self, writer: bool = False, may_resume: bool = True) -> None:
        """Back-pressure (docs/PROTOCOL.md §5 Flow control), with hysteresis: USER is paused
        when the unsent bytes (queued plus being written) pass the high mark,
        backPressureThreshold of the buffer, and resumed only once they are down to the
        low mark, a quarter of the high one. Two rules keep the pair from feeding itself:
        a pause needs data queued since the last resume (the PAUSE/RESUME frames and the
        write of what is already queued never pause again on their own), and no resume is
        decided inside take_writable, between taking a batch off the queue and the
        transport reporting it in flight, when the batch is counted nowhere.

        A client is stuck when bytes the session could send (not held back by the client's
        own credit or pause) pass the whole buffer while a write is blocked: only another
        caller than the writer can see that."""
        s = self.settings
        unsent = self._pending_bytes + self._resend_bytes + self.in_flight
        if unsent < self._low_water and not self.paused_by_server:
            return  # the common case: nearly nothing buffered
        high = s.outbound_buffer_size * s.back_pressure_threshold
        if s.credits.enabled:
            if "USER" not in self.paused_by_server:
                if unsent > high and self._pause_armed:
                    self.paused_by_server = _with(self.paused_by_server, "USER")
                    self._enqueue(pause_channel("USER"))
            elif may_resume and unsent <= high / 4:
                self.paused_by_server = _without(self.paused_by_server, "USER")
                self._pause_armed = False
                self._enqueue(resume_channel("USER"))
        if writer or not self.in_flight or self._overflowed or not self._connected():
            return
        sendable = self.in_flight + self._resend_bytes + sum(
            nbytes for channel, nbytes in self._pending_channel_bytes.items()
            if nbytes and channel not in self.paused_by_client
            and self.credits.can_send(channel, 0))
        if sendable > s.outbound_buffer_size:
            self._overflowed = True
            self._events.append(SlowConsumer(sendable))

    # -- to the wire ----------------------------------------------------------------------

    def has_writable(self) -> bool:
        return bool(self.pending or self._resend.ranges)

    def take_writable(self, now: int) -> list[tuple[int, bytes]]:
        """Messages ready for the wire, in seq order: replays first, then pending
        messages whose channel has credit and is not paused (those get their seq now).

        A replay comes a batch of about REPLAY_BATCH_BYTES at a time, read from the
        window; until it is all taken nothing newer is, so the wire stays in seq order.
        Call again while ``has_writable()``."""
        if self._resend.ranges:
            out = self._resend.take(self.replay, REPLAY_BATCH_BYTES)
            self.traffic.replayed_messages += len(out)
            if self._resend.ranges:
                self._resend_bytes = self._resend.nbytes(self.replay)
                return out
            self._resend_bytes = 0
        else:
            out = []
        pending, sizes = self.pending, self._pending_sizes
        if not pending:
            return out
        self.pending = self._pending_sizes = _EMPTY
        credits = self.credits
        paused = self.paused_by_client
        blocked: set[str] | None = None  # channels held back in this pass (rarely any)
        sid, ts = self.session_id, str(now)
        sent = self.traffic.sent
        store = self.replay.add
        seq = self.downstream_seq
        for i, ob in enumerate(pending):
            mtype, channel = ob.type, ob.channel
            control = mtype in CONTROL_TYPES
            if not control and (channel in paused or (blocked and channel in blocked)):
                blocked = self._hold(blocked, channel, ob, sizes[i])
                continue
            number = str(seq + 1)
            data = dumps({"id": ob.id or f"{sid}:{number}", "session": sid, "seq": number,
                          "ts": ts, "type": mtype, "channel": channel,
                          "payload": ob.payload}, option=ENCODING)
            if not control:
                if not credits.can_send(channel, len(data)):
                    blocked = self._hold(blocked, channel, ob, sizes[i])
                    continue
                credits.spend(channel, len(data))
            seq += 1
            self.downstream_seq = seq
            out.append((seq, store(seq, data, now) if mtype != "HELLO"
                        else store(seq, data, now, _hello_shared(ob))))
            try:
                sent[mtype] += 1
            except KeyError:  # an application's own type
                sent[mtype] = 1
        # the byte counts once for the pass, not per message: nothing is left, or what was
        # held back (the queue now holds exactly that)
        if blocked is None:
            self._pending_bytes = 0
            self._pending_channel_bytes.clear()
        else:
            self._count_pending()
        # what was just taken is not in flight yet: no resume decision here (see above)
        if self._pending_bytes + self._resend_bytes + self.in_flight >= self._low_water \
                or self.paused_by_server:  # check_pressure's own first test, saving a call
            self.check_pressure(may_resume=False)
        return out

    def _hold(self, blocked: set[str] | None, channel: str, ob: Outbound,
              size: int) -> set[str]:
        """Put a message back, behind those held before it (order within a channel); the
        channel is held back for the rest of the pass. Returns the held channels."""
        self._put(ob, size)
        if blocked is None:
            return {channel}
        blocked.add(channel)
        return blocked

    def _count_pending(self) -> None:
        """The pending byte counts, from what the queue holds."""
        by_channel = self._pending_channel_bytes
        by_channel.clear()
        for ob, size in zip(self.pending, self._pending_sizes, strict=True):
            by_channel[ob.channel] = by_channel.get(ob.channel, 0) + size
        self._pending_bytes = sum(self._pending_sizes)

    # -- replays --------------------------------------------------------------------------

    def queue_replay(self, from_seq: int, to_seq: int | None, now: int, source: str,
                     related_id: str | None = None) -> ReplayUnavailable | None:
        """Write the window's ``from_seq``..``to_seq`` (None: the newest) again. Returns
        the error to report when part of it is gone. ``source``: "resume" (a reconnect
        with last_seq) or "request" (REPLAY_REQUEST), for the replay counters."""
        replays = self.traffic.replays
        if to_seq is not None:
            to_seq = min(to_seq, self.downstream_seq)
        elif from_seq > self.downstream_seq:
            replays[source, "complete"] += 1  # nothing was sent after it
            return None
        self.replay.prune(now)
        complete = self.replay.holds(from_seq)
        # merged with what is already queued: asking again for the same range costs
        # nothing, so the queue never holds more than the window
        if self._resend is NO_RESENDS:  # its own, made with its first range
            self._resend = ResendQueue()
        self._resend.add(from_seq, self.downstream_seq if to_seq is None else to_seq)
        self._resend_bytes = self._resend.nbytes(self.replay)
        self.check_pressure()
        unavailable = not complete and (to_seq is None or from_seq <= to_seq)
        replays[source, "unavailable" if unavailable else "complete"] += 1
        if not unavailable:
            return None
        first = self.replay.first_seq
        return ReplayUnavailable(
            f"messages from seq {from_seq} are no longer available",
            detail={"first_available": str(first if first is not None
                                            else self.downstream_seq + 1)},
            related_id=related_id)

    # -- moving to another node (core.handoff) --------------------------------------------

    def take_pending(self) -> list[Outbound]:
        """Remove and return every message queued but not yet stamped (a session that
        moves to another node hands them over), keeping the byte counts true."""
        pending = self.pending or []  # its own list (a new one when empty)
        self.pending = self._pending_sizes = _EMPTY
        self._pending_channel_bytes.clear()
        self._pending_bytes = 0
        return pending

    def export_pending(self) -> list[dict[str, Any]]:
        """Messages queued but not yet stamped, as JSON-ready data."""
        return [ob.to_dict() for ob in self.pending]

    def pause_by_client(self, channel: str) -> None:
        self.paused_by_client = _with(self.paused_by_client, channel)

    def resume_by_client(self, channel: str) -> None:
        self.paused_by_client = _without(self.paused_by_client, channel)

    def restore(self, downstream_seq: int, paused_by_client: AbstractSet[str],
                replay: Any, acked: int, now: int) -> None:
        """Take the seq, the client's pauses and the window's (seq, stored_at, data)
        entries from the node that held the session; entries up to ``acked`` stay out."""
        self.paused_by_client = paused_by_client or _NONE
        for seq, stored_at, data in replay:
            if seq > acked:
                self.replay.add(seq, data, stored_at)
            downstream_seq = max(downstream_seq, seq)
        self.downstream_seq = downstream_seq
        self.replay.prune(now)


_NONE: frozenset[str] = frozenset()
#: an empty queue's ``pending`` and sizes: the empty tuple (read as a list, never changed)
_EMPTY: Any = ()


def _hello_shared(ob: Outbound) -> tuple[bytes, ...] | None:
    """What a HELLO reply shares with every other session's (replay.py keeps it once):
    its capabilities and its type list, as they are encoded in it. Every reply of a
    worker's sessions carries the same two objects (``hello.capabilities`` and
    ``messages.sorted_types``, made once), so the last pair's segments are kept and
    given again for the same objects (held here: an id is not reused while they live).
    Segments that do not match the reply (a pair changed after it was encoded) would
    only be left unmarked: the window's compaction is exact whatever it is given."""
    p = ob.payload
    caps, types = p.get("capabilities"), p.get("accept_events")
    last = _last_shared
    if caps is last[0] and types is last[1] and caps is not None:
        return last[2]  # type: ignore[no-any-return]
    if not isinstance(caps, dict) or not isinstance(types, list):
        return None  # an application's own HELLO
    segments = shared(dumps(caps, option=ENCODING), dumps(types, option=ENCODING))
    _last_shared[:] = [caps, types, segments]
    return segments


#: the last HELLO reply's capabilities, type list and their segments (``_hello_shared``)
_last_shared: list[Any] = [None, None, None]


def _with(channels: AbstractSet[str], channel: str) -> AbstractSet[str]:
    return channels | {channel} if channel not in channels else channels


def _without(channels: AbstractSet[str], channel: str) -> AbstractSet[str]:
    return (channels - {channel}) or _NONE if channel in channels else channels
