"""OutboundQueue.push, the swap point between push_plain (the definition: the full check,
_enqueue, check_pressure) and push_fast (the two calls written out): one test class runs
its cases over both, and any sequence of pushes, writes and takes leaves two queues, one
on each, in the same state."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import given, settings, strategies as st

from protoflask.core import messages
from protoflask.core.credits import CreditLedger
from protoflask.core.events import Event, SendRefused, SlowConsumer
from protoflask.core.meter import Meter
from protoflask.core.outbound import ENVELOPE_OVERHEAD, OutboundQueue
from protoflask.core.traffic import TrafficCounters

from ._support import credit_settings, session_settings
from .test_meter import Lend, Limit

IMPLEMENTATIONS = {"plain": OutboundQueue.push_plain, "fast": OutboundQueue.push_fast}


class Queue:
    """An OutboundQueue pushed through one implementation, with its events and a switch
    for whether a transport is attached."""

    def __init__(self, push: Callable[[OutboundQueue, messages.Outbound], bool],
                 budget: int | None = None, lend: bool = False, **overrides: Any) -> None:
        s = session_settings(**{"credits": credit_settings(enabled=True), **overrides})
        self.events: list[Event] = []
        self.connected = True
        self.q = OutboundQueue("s", s, CreditLedger(s.credits), TrafficCounters(),
                               self.events, lambda: self.connected)
        self._push = push
        if budget is not None:  # metered: a user's account of ``budget`` bytes, or none
            self.q.meter = Meter()  # (``lend``: one that lends the meter slices)
            self.q.meter.account = (Lend(budget, budget // 3) if lend else Limit(budget)) \
                if budget else None
            if lend and budget:  # its first slice, as a call's charge would have it lent
                self.q.meter.account.lend(self.q.meter, 0)  # type: ignore[union-attr]

    def push(self, out: messages.Outbound) -> bool:
        return self._push(self.q, out)

    def state(self) -> tuple[Any, ...]:
        q = self.q
        meter = q.meter
        return ([(o.type, o.channel, o.payload) for o in q.pending], q.pending_bytes,
                q.unsent_bytes, sorted(q.paused_by_server), q.under_load(),
                [repr(e) for e in self.events], q.downstream_seq,
                meter and (meter.window, meter.spare, meter.cap,
                           meter.account and vars(meter.account)))


def part(text: str, channel: str = "AGENT") -> messages.Outbound:
    return messages.from_dict({"type": "MESSAGE_PART", "channel": channel,
                               "payload": {"message_id": "m", "content": text}})


class TestPush:
    @pytest.fixture(params=sorted(IMPLEMENTATIONS))
    def make(self, request: pytest.FixtureRequest) -> Callable[..., Queue]:
        return lambda **overrides: Queue(IMPLEMENTATIONS[request.param], **overrides)

    def test_the_swap_point_serves_the_fast_one(self) -> None:
        assert OutboundQueue.push is OutboundQueue.push_fast

    def test_messages_queue_in_order_with_their_estimated_sizes(self, make) -> None:
        queue = make()
        assert queue.push(part("a")) and queue.push(part("bb", "USER"))
        assert queue.push(messages.ping("n"))
        assert [o.type for o in queue.q.pending] == ["MESSAGE_PART", "MESSAGE_PART", "PING"]
        sizes = [len(b'{"message_id":"m","content":"a"}'),
                 len(b'{"message_id":"m","content":"bb"}'), len(b'{"nonce":"n"}')]
        assert queue.q.pending_bytes == sum(sizes) + 3 * ENVELOPE_OVERHEAD

    def test_a_full_queue_refuses_and_reports_but_takes_control_messages(self, make) -> None:
        queue = make(max_pending_messages=3)
        for i in range(3):
            assert queue.push(part(str(i)))
        assert not queue.push(part("dropped"))
        assert queue.events == [SendRefused("MESSAGE_PART", "AGENT")]
        assert queue.push(messages.pong("n"))  # control: queued anyway
        assert len(queue.q.pending) == 4 and len(queue.events) == 1

    def test_full_in_bytes_too(self, make) -> None:
        queue = make(outbound_buffer_size=1000, max_message_size=200)
        while queue.q.pending_bytes < 1000:
            assert queue.push(part("x" * 100, "USER"))
        assert not queue.push(part("y"))
        assert isinstance(queue.events[-1], SendRefused)

    def test_control_messages_piling_up_behind_a_blocked_write_are_a_slow_consumer(
            self, make) -> None:
        queue = make(max_pending_messages=2)
        queue.push(part("a"))
        queue.push(part("b"))
        queue.q.set_in_flight(10)  # a write is blocked
        queue.push(messages.pong("1"))
        queue.push(messages.pong("2"))
        assert [type(e) for e in queue.events].count(SlowConsumer) == 1  # reported once

    def test_past_the_high_mark_user_is_paused_once(self, make) -> None:
        queue = make(outbound_buffer_size=2000, back_pressure_threshold=0.5,
                     max_message_size=500)
        while "USER" not in queue.q.paused_by_server:
            assert queue.push(part("x" * 200, "AGENT"))
        pauses = [o for o in queue.q.pending if o.type == "PAUSE_CHANNEL"]
        assert len(pauses) == 1 and pauses[0].payload == {"channel": "USER"}
        queue.push(part("more"))
        assert len([o for o in queue.q.pending if o.type == "PAUSE_CHANNEL"]) == 1


operations = st.lists(st.one_of(
    st.tuples(st.just("push"), st.sampled_from(["MESSAGE_PART", "PONG", "ERROR"]),
              st.sampled_from(["AGENT", "USER", "SYSTEM"]), st.integers(0, 400)),
    st.tuples(st.just("in_flight"), st.integers(0, 3000)),
    st.tuples(st.just("take"), st.integers(0, 10)),
    st.tuples(st.just("connected"), st.booleans()),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(1, 12), st.integers(600, 5000),
       st.none() | st.just(0) | st.integers(100, 3000), st.booleans())
def test_any_sequence_leaves_both_in_the_same_state(ops, max_pending, buffer,
                                                    budget, lend) -> None:
    """``budget``: unmetered (None), metered without an account (0), or with one;
    ``lend``: an account that lends the meter slices."""
    overrides = {"max_pending_messages": max_pending, "outbound_buffer_size": buffer,
                 "max_message_size": 300, "back_pressure_threshold": 0.5}
    plain = Queue(OutboundQueue.push_plain, budget, lend, **overrides)
    fast = Queue(OutboundQueue.push_fast, budget, lend, **overrides)
    for op in ops:
        for queue in (plain, fast):
            if op[0] == "push":
                _, mtype, channel, n = op
                out = messages.from_dict({"type": mtype, "channel": channel,
                                          "payload": {"message_id": "m", "content": "x" * n}})
                queue.result = queue.push(out)  # type: ignore[attr-defined]
            elif op[0] == "in_flight":
                queue.q.set_in_flight(op[1])
            elif op[0] == "take":
                queue.q.take_writable(op[1])
            else:
                queue.connected = op[1]
        assert plain.state() == fast.state(), op
        if op[0] == "push":
            assert plain.result == fast.result  # type: ignore[attr-defined]
