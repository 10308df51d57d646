"""The journal's state line (cluster.state.StateLine): the same bytes as exporting and
encoding the whole state, whatever the session went through since its last line."""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from protoflask.cluster.state import StateLine, encode_state, export_journaled
from protoflask.core import messages
from protoflask.core.session import ProtocolSession

from ..core._support import Client, make_session

Step = Callable[[ProtocolSession, Client], Any]


def _run(s: ProtocolSession, c: Client) -> None:
    run = s.work.start_run(c.now)
    s.work.open_call(f"call-{len(s.calls)}-{c.now}", run.run_id)


def _finish_calls(s: ProtocolSession, c: Client) -> None:
    for call_id in list(s.calls):
        s.work.tool_done(call_id, "OK", {})
    for run_id in list(s.runs):
        s.work.finish_run(run_id, c.now)


# what moves a session's state: the client's messages, the application's, the clock, and
# the slow parts changed directly (the adaptive grant, a second HELLO's events)
STEPS: dict[str, Step] = {
    "ping": lambda s, c: c.send("PING", {"nonce": "n"}),
    "skip a seq": lambda s, c: c.send("PING", {"nonce": "n"}, seq=c.seq + 3),
    "the skipped seq": lambda s, c: c.send("PING", {"nonce": "n"}, seq=max(1, c.seq - 1)),
    "user text": lambda s, c: c.send("MESSAGE_START", {"message_id": f"m{c.seq}",
                                                       "role": "user"}),
    # a text open: its parts so far are in the state (they move with the session)
    "text start": lambda s, c: c.send("MESSAGE_START", {"message_id": "t",
                                                        "content_type": "text/plain"}),
    "text part": lambda s, c: c.send("MESSAGE_PART", {"message_id": "t", "content": "p"}),
    "text end": lambda s, c: c.send("MESSAGE_END", {"message_id": "t"}),
    "ack": lambda s, c: c.send("ACK", {"seq": str(s.downstream_seq)}),
    "pause": lambda s, c: c.send("PAUSE_CHANNEL", {"channel": "AGENT"}),
    "resume": lambda s, c: c.send("RESUME_CHANNEL", {"channel": "AGENT"}),
    "flow update": lambda s, c: c.send("FLOW_UPDATE", {"channel": "AGENT", "add_messages": 2,
                                                       "add_bytes": 100}),
    "note": lambda s, c: s.send(messages.create("NOTE", {"n": c.seq})),
    "take": lambda s, c: c.take_raw(),
    "clock": lambda s, c: setattr(c, "now", c.now + 7),
    "run and call": _run,
    "calls done": _finish_calls,
    "grant": lambda s, c: setattr(s.credits, "grant", s.credits.grant * 2),
    "events": lambda s, c: setattr(s, "accept_events", frozenset({"PING", f"E{c.seq % 3}"})),
    "no events": lambda s, c: setattr(s, "accept_events", None),
}


@settings(max_examples=300, deadline=None)
@given(downstream=st.booleans(), steps=st.lists(st.sampled_from(sorted(STEPS)), max_size=30))
def test_the_line_is_the_encoded_export_after_any_steps(downstream: bool,
                                                        steps: list[str]) -> None:
    s = make_session(now=1_000)
    c = Client(s, now=1_000)
    line = StateLine(s)
    assert line.encode() == encode_state(export_journaled(s))  # before the handshake
    c.handshake(capabilities={"flow_control": {"downstream": downstream}})
    for name in steps:
        STEPS[name](s, c)
        assert line.encode() == encode_state(export_journaled(s)), name
        assert line.encode() == encode_state(export_journaled(s)), name  # and once more, kept


def test_a_session_passing_pings_keeps_its_line_and_writes_only_the_numbers() -> None:
    s = make_session(now=1_000)
    c = Client(s, now=1_000)
    c.handshake()
    line = StateLine(s)
    line.encode()
    kept = line._template
    assert kept.count(b"%d") == 5
    for n in range(5):
        c.now += 1
        c.send("PING", {"nonce": f"n{n}"})
        c.take_raw()
        assert line.encode() == encode_state(export_journaled(s))
    assert line._template is kept


def test_a_user_id_that_reads_as_the_placeholder_is_encoded_whole() -> None:
    s = ProtocolSession("sess-1", "\x00hole", make_session().settings, 0)
    s.attach(0)
    Client(s).handshake()
    line = StateLine(s)
    assert line.encode() == encode_state(export_journaled(s))
    assert line._template == b""  # no line kept: each time exported and encoded whole
