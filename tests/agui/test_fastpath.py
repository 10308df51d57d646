"""The AG-UI translation's fast paths and their plain definitions (docs/ARCHITECTURE.md,
"Fast paths and their plain definitions"): ``RunTranslator.translate`` (what the SSE
stream of ``/proto/agui`` writes) and ``SocketTranslator.__call__`` (what an AG-UI
session's WebSocket writes) are the swap points; ``translate_plain`` decodes every message
and maps it, ``translate_fast`` writes a text part of an open text around its envelope's
bytes. One class runs the same cases over both and holds them equal: the bytes written,
batch by batch (replays and a catch-up included), and the translator's state after.

The messages are stamped by a real session core (``ProtocolSession.take_writable``), as
they reach the translators: the fast paths read the envelope as the core writes it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from protoflask.agui.mapping import AGUI_EVENT, RunTranslator, is_part_tail
from protoflask.agui.socket import SocketTranslator
from protoflask.config import ServerConfig
from protoflask.core import messages
from protoflask.core.session import ProtocolSession
from protoflask.live import LiveSession

from .conftest import validate

Ready = list[tuple[int, bytes]]
SSE = {"plain": RunTranslator.translate_plain, "fast": RunTranslator.translate_fast}
SOCKET = {"plain": SocketTranslator.translate_plain, "fast": SocketTranslator.translate_fast}
#: message ids: the common (hex), and ones whose JSON text differs from the id (escapes,
#: non-ASCII), and "None" (what a START without an id opens)
IDS = ["m1", "0123456789abcdef0123456789abcdef", 'q"x', "b\\s", "é€", "None", "m\n2"]
#: contents: plain, with quotes and backslashes (escaped in JSON), ending in a backslash
#: (its closing quote follows an escaped backslash), control characters, non-ASCII
TEXTS = ["token 1 ", "", 'say "hi"', "a\\", "\\", 'x\\"y', "tab\tnl\n", "é😀", "}}", '"}}']


def make_core(window: int = 100000) -> ProtocolSession:
    base = ServerConfig().session_settings()
    s = replace(base, credits=replace(base.credits, enabled=False), replay_window_size=window)
    core = ProtocolSession("agui-fast", "u", s, 0, greeted=True)
    core.attach(0)
    return core


def stamp(core: ProtocolSession, outs: list[messages.Outbound]) -> Ready:
    """The messages as the core stamps them for the wire."""
    for out in outs:
        assert core.send(out)
    ready = core.take_writable(1764230000000)
    assert len(ready) == len(outs)
    return ready


def agui(event: dict[str, Any]) -> messages.Outbound:
    return messages.Outbound(AGUI_EVENT, "AGENT", event)


def raw(mtype: str, payload: dict[str, Any], channel: str = "AGENT") -> messages.Outbound:
    return messages.from_dict({"type": mtype, "channel": channel, "payload": payload})


def a_run(run_id: str = "r1") -> list[messages.Outbound]:
    """A run with every kind of message the mapping reads, and what looks like a part but
    is not one the fast path may write (extra keys, keys in another order, a non-string
    content, a part nested in another message's payload, a part of a closed text)."""
    outs = [messages.ping("n0"), messages.text_part("m1", "before the run"),
            messages.run_started(run_id, "t1")]
    for mid in IDS:
        outs.append(messages.text_start(mid))
        outs += [messages.text_part(mid, text) for text in TEXTS]
    outs += [
        raw("MESSAGE_PART", {"message_id": "m1", "content": "x", "extra": "y"}),
        raw("MESSAGE_PART", {"message_id": "m1", "content": "x\\", "k\\": "v"}),
        raw("MESSAGE_PART", {"content": "reordered", "message_id": "m1"}),
        raw("MESSAGE_PART", {"message_id": "m1", "content": 5}),
        raw("MESSAGE_PART", {"message_id": "m1", "content": ["a"]}),
        raw("MESSAGE_PART", {"message_id": "m1"}),
        raw("MESSAGE_PART", {"message_id": 7, "content": "not a string id"}),
        agui({"type": "CUSTOM", "name": "nested", "value": {
            "type": "MESSAGE_PART", "channel": "AGENT",
            "payload": {"message_id": "m1", "content": "nested"}}}),
        raw("NOTE", {"type": "MESSAGE_PART", "channel": "AGENT",
                     "payload": {"message_id": "m1", "content": "nested"}}),
        agui({"type": "TEXT_MESSAGE_START", "messageId": "app", "role": "assistant"}),
        messages.text_part("app", "a text the application opened"),
        agui({"type": "TEXT_MESSAGE_END", "messageId": "app"}),
        messages.text_part("app", "after its end"),
        messages.text_end("m1"),
        messages.text_part("m1", "after the end"),
        messages.text_part("unknown", "never opened"),
        agui({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "w"}),
        messages.tool_update("c1", "RUNNING", 50),
        messages.text_part("b\\s", "between tool messages"),
        messages.tool_done("c1", "OK", {"ok": True}),
        messages.ping("n1"),
        messages.run_finished(run_id, "finished", summary={"done": 1}),
        messages.text_part("é€", "after the run"),
    ]
    return outs


def batches(ready: Ready, sizes: list[int]) -> list[Ready]:
    out, i = [], 0
    for size in sizes:
        if i >= len(ready):
            break
        out.append(ready[i:i + size])
        i += size
    if i < len(ready):
        out.append(ready[i:])
    return out


def sse_events(written: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in written.split(b"\n") if line.startswith(b"data: ")]


class TestTranslate:
    """RunTranslator.translate, the SSE stream's swap point."""

    @pytest.fixture(params=sorted(SSE))
    def translate(self, request: pytest.FixtureRequest
                  ) -> Callable[[RunTranslator, Ready], bytes]:
        return SSE[request.param]

    def test_the_swap_point_serves_the_fast_one(self) -> None:
        assert RunTranslator.translate is RunTranslator.translate_fast

    def test_a_run_translates_to_valid_events(self, translate) -> None:
        tr = RunTranslator("t1", "r1")
        written = translate(tr, stamp(make_core(), a_run()))
        events = sse_events(written)
        assert events[0] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}
        assert events[-1]["type"] == "RUN_FINISHED" and tr.ended
        deltas = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
        assert deltas[:len(TEXTS)] == TEXTS and "nested" not in deltas
        assert "never opened" not in deltas and "after its end" not in deltas
        assert "a text the application opened" in deltas
        for event in events:
            if event["type"] == "TEXT_MESSAGE_CONTENT" and not isinstance(event["delta"], str):
                continue  # a non-string content: the mapping passes it on, as it came
            validate(event)

    @pytest.mark.parametrize("size", [1, 3, 50])
    def test_plain_and_fast_write_the_same(self, size: int) -> None:
        self.same(a_run(), [size] * 1000)

    @pytest.mark.parametrize("after", [0, 5, 12, 40])
    def test_a_reattach_is_the_same_both_ways(self, after: int) -> None:
        ready = stamp(make_core(), a_run())
        out = {}
        for name, translate in SSE.items():
            tr = RunTranslator("t1", "r1", resume_after=ready[0][0] + after)
            out[name] = ([translate(tr, b) for b in batches(ready, [4] * 100)], tr.open)
        assert out["plain"] == out["fast"]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def test_any_run_any_batches(self, data: st.DataObject) -> None:
        self.same(data.draw(runs()), data.draw(st.lists(st.integers(1, 8), max_size=60)))

    @staticmethod
    def same(outs: list[messages.Outbound], sizes: list[int]) -> None:
        ready = stamp(make_core(), outs)
        results = {}
        for name, translate in SSE.items():
            tr = RunTranslator("t1", "r1")
            written = [translate(tr, b) for b in batches(ready, sizes)]
            results[name] = (written, tr.open, tr.texts, tr.calls, tr.ended, tr.pings)
        assert results["plain"] == results["fast"]


class TestSocketTranslator:
    """SocketTranslator.__call__, the WebSocket's swap point (SessionPort.translate)."""

    def test_the_swap_point_serves_the_fast_one(self) -> None:
        assert SocketTranslator.__call__ is SocketTranslator.translate_fast

    @pytest.mark.parametrize("impl", sorted(SOCKET))
    def test_a_run_becomes_agui_envelopes(self, impl: str) -> None:
        core = make_core()
        ready = stamp(core, a_run())
        out = SOCKET[impl](SocketTranslator(LiveSession(core)), ready)
        envs = [orjson.loads(frame) for _, frame in out]
        agui_events = [e["payload"] for e in envs if e["type"] == AGUI_EVENT]
        assert agui_events[0]["type"] == "RUN_STARTED"
        assert agui_events[-1]["type"] == "RUN_FINISHED"
        parts = [e for e in envs if e["type"] == AGUI_EVENT
                 and e["payload"]["type"] == "TEXT_MESSAGE_CONTENT"]
        assert [e["payload"]["delta"] for e in parts[:len(TEXTS)]] == TEXTS
        for env in parts:  # the head of the message each was made from
            assert env["session"] == core.id and env["id"] == f"{core.id}:{env['seq']}"
            if isinstance(env["payload"]["delta"], str):
                validate(env["payload"])
        natives = [e["type"] for e in envs if e["type"] != AGUI_EVENT]
        assert natives[:2] == ["PING", "MESSAGE_PART"] and "NOTE" in natives

    @pytest.mark.parametrize("size", [1, 3, 50])
    def test_plain_and_fast_write_the_same(self, size: int) -> None:
        self.same(a_run() + a_run("r2"), [size] * 1000, replays=[])

    def test_replays_after_a_resume_are_the_same(self) -> None:
        # a resume from seq 10, then one from 3 (each a replay of what was written)
        self.same(a_run() + a_run("r2"), [7] * 1000, replays=[(10, 30), (3, 60)])

    def test_a_memo_trimmed_to_the_window_is_the_same(self) -> None:
        # past TRIM_EVERY seqs several times, in a window of 64: what left it is
        # replayed as the window has it, both ways
        outs = [out for run in ("r1", "r2", "r3", "r4") for out in a_run(run)]
        self.same(outs, [9] * 1000, replays=[(30, 80), (45, 40)], window=64)

    def test_a_catch_up_is_the_same(self) -> None:
        # the translator starts at a later seq: what came before is read from the window
        self.same(a_run() + a_run("r2"), [5] * 1000, replays=[], skip=20)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def test_any_runs_any_batches_any_replays(self, data: st.DataObject) -> None:
        outs = data.draw(runs()) + data.draw(runs("r2"))
        sizes = data.draw(st.lists(st.integers(1, 8), max_size=80))
        replays = data.draw(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 20)),
                                     max_size=3))
        self.same(outs, sizes, replays, skip=data.draw(st.sampled_from([0, 0, 3, 11])))

    @staticmethod
    def same(outs: list[messages.Outbound], sizes: list[int],
             replays: list[tuple[int, int]], skip: int = 0, window: int = 100000) -> None:
        """Both implementations on one core's messages, in ``sizes`` batches from the
        ``skip``-th; before batch i of ``replays`` (i, n), the n seqs before it again."""
        core = make_core(window)
        ready = stamp(core, outs)[skip:]
        results = {}
        for name, translate in SOCKET.items():
            tr = SocketTranslator(LiveSession(core))
            written: list[Ready] = []
            pending = dict(replays)
            for i, batch in enumerate(batches(ready, sizes)):
                if i in pending:
                    first = ready.index(batch[0])
                    again = ready[max(0, first - pending[i]):first]
                    written.append(translate(tr, again + batch))
                else:
                    written.append(translate(tr, batch))
            run = tr.run
            results[name] = (written, tr.last, tr.memo, tr.floor,
                             None if run is None else (run.open, run.texts, run.calls))
        assert results["plain"] == results["fast"]


def test_is_part_tail() -> None:
    def tail(content: Any, **extra: Any) -> bytes:
        data = orjson.dumps({"type": "MESSAGE_PART", "payload": {
            "message_id": "m", "content": content, **extra}})
        return data.partition(b'"content":')[2]

    for text in TEXTS:  # one ending in a backslash goes the slow way (the docstring)
        assert is_part_tail(tail(text)) is not text.endswith("\\"), text
    assert not is_part_tail(tail(5))
    assert not is_part_tail(tail(["a"]))
    assert not is_part_tail(tail("a", extra="b"))
    assert not is_part_tail(tail("a\\", **{"k\\": "v"}))


def runs(run_id: str = "r1") -> st.SearchStrategy[list[messages.Outbound]]:
    """A run's messages in any order, with any ids and contents."""
    ids = st.sampled_from(IDS)
    text = st.one_of(st.sampled_from(TEXTS), st.text(max_size=12))
    message = st.one_of(
        st.builds(messages.text_start, ids),
        st.builds(messages.text_part, ids, text),
        st.builds(messages.text_part, ids, text),
        st.builds(messages.text_part, ids, text),
        st.builds(messages.text_end, ids),
        st.builds(lambda i, t: raw("MESSAGE_PART", {"message_id": i, "content": t, "x": 1}),
                  ids, text),
        st.builds(lambda i: agui({"type": "TEXT_MESSAGE_START", "messageId": i,
                                  "role": "assistant"}), ids),
        st.builds(lambda i: agui({"type": "TEXT_MESSAGE_END", "messageId": i}), ids),
        st.builds(lambda i, t: agui({"type": "CUSTOM", "name": "n", "value": {
            "type": "MESSAGE_PART", "channel": "AGENT",
            "payload": {"message_id": i, "content": t}}}), ids, text),
        st.builds(lambda: messages.ping("n")),
        st.builds(lambda: messages.run_finished(run_id, "cancelled")),
    )
    return st.lists(message, max_size=40).map(
        lambda body: [messages.run_started(run_id, "t1"), *body,
                      messages.run_finished(run_id, "finished")])
