"""``server.stream_text``: a model's reply streamed as one text, its tokens coalesced into
parts by a time and a size budget, stopped by RUN_CANCEL or a session that is gone."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Iterator

import orjson
import pytest

from protoflask import ProtoError, ProtoServer

from ..support import WSClient, wait_for


class InThread:
    """stream_text from another thread, so the test can read and cancel while it runs."""

    def __init__(self, fn: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Any) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self) -> "InThread":
        wait_for(lambda: not self.thread.is_alive(), what="stream_text to return")
        return self


def model(tokens: int, delay: float = 0.0, closed: list[bool] | None = None) -> Iterator[str]:
    """A fake model: ``tokens`` words, ``delay`` seconds apart."""
    try:
        for i in range(tokens):
            if delay:
                time.sleep(delay)
            yield f"w{i} "
    finally:
        if closed is not None:
            closed.append(True)


@pytest.fixture
def session(make_server) -> Iterator[tuple[ProtoServer, WSClient, str]]:
    server = make_server()
    client = WSClient(server.base_url, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    yield server, client, sid
    client.close()


def texts_of(client: WSClient, message_id: str) -> list[dict[str, Any]]:
    return [m for m in client.received if m["type"].startswith("MESSAGE_")
            and m["payload"]["message_id"] == message_id]


def test_a_fast_model_arrives_as_one_start_few_parts_and_one_end(session) -> None:
    server, client, sid = session
    expected = "".join(model(2000))
    started = time.monotonic()
    sent = server.stream_text(sid, model(2000))
    elapsed_ms = (time.monotonic() - started) * 1000
    assert sent.complete and sent.stopped is None and sent.text == expected
    client.recv_type("MESSAGE_END", message_id=sent.message_id)
    seen = texts_of(client, sent.message_id)
    assert [m["type"] for m in seen[:1] + seen[-1:]] == ["MESSAGE_START", "MESSAGE_END"]
    assert seen[0]["payload"]["content_type"] == "text/plain"
    parts = [m["payload"]["content"] for m in seen[1:-1]]
    assert "".join(parts) == expected and len(parts) == sent.parts
    # the budget: a part per 2048 characters, plus one per 50 ms the stream took
    assert len(parts) <= math.ceil(len(expected) / 2048) + math.ceil(elapsed_ms / 50) + 1
    assert len(parts) < 100  # far from one per token


def test_run_cancel_stops_the_stream_within_one_part(session) -> None:
    server, client, sid = session
    run = server.start_run(sid)
    closed: list[bool] = []
    # tokens 30 ms apart and a 10 ms budget: one part per token, so "within one part"
    # is "within one token" of the server's handling the RUN_CANCEL (its RUN_FINISHED)
    streaming = InThread(lambda: server.stream_text(
        sid, model(500, delay=0.03, closed=closed), run_id=run["runId"], max_delay_ms=10))
    for _ in range(3):
        client.recv_type("MESSAGE_PART")
    client.send("RUN_CANCEL", "USER", {"run_id": run["runId"]})
    sent = streaming.join().result
    assert streaming.error is None
    assert sent.stopped == "run_cancelled" and not sent.complete
    assert closed == [True]  # the model's stream was closed, not left hanging
    client.recv_type("MESSAGE_END", message_id=sent.message_id)
    client.send("PING", "SYSTEM", {"nonce": "after"})
    client.recv_type("PONG", nonce="after")
    # the wire is in seq order: what came after the run's RUN_FINISHED came after the
    # server had handled the cancel
    finished = next(i for i, m in enumerate(client.received)
                    if m["type"] == "RUN_FINISHED" and m["payload"]["run_id"] == run["runId"])
    late = [m for m in client.received[finished:] if m["type"] == "MESSAGE_PART"]
    assert len(late) <= 1
    parts = [m for m in texts_of(client, sent.message_id) if m["type"] == "MESSAGE_PART"]
    assert len(parts) == sent.parts and sent.parts < 500  # stopped long before the end


def test_a_session_that_is_gone_stops_the_stream(make_server) -> None:
    server = make_server(replayWindowTime=300)
    client = WSClient(server.base_url, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    closed: list[bool] = []
    streaming = InThread(lambda: server.stream_text(sid, model(10_000, 0.01, closed)))
    client.recv_type("MESSAGE_PART")
    client.drop()  # kept for 300 ms (the stream goes to the replay window), then gone
    sent = streaming.join().result
    assert streaming.error is None and sent.stopped == "session_gone" and closed == [True]
    assert server.get_session(sid) is None


def test_an_error_in_the_model_closes_the_text_and_propagates(session) -> None:
    server, client, sid = session

    def broken() -> Iterator[str]:
        yield "half a "
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        server.stream_text(sid, broken())
    end = client.recv_type("MESSAGE_END")
    seen = texts_of(client, end["payload"]["message_id"])
    assert [m["type"] for m in seen] == ["MESSAGE_START", "MESSAGE_PART", "MESSAGE_END"]
    assert seen[1]["payload"]["content"] == "half a "


def test_no_part_exceeds_max_message_size(make_server) -> None:
    server = make_server(maxMessageSize=4096)
    client = WSClient(server.base_url, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    big = "\x01" * 20_000  # the worst case: every character escaped to 6 bytes of JSON
    sent = server.stream_text(sid, [big, None, "", "end"], content_type="text/markdown")
    end = client.recv_type("MESSAGE_END", message_id=sent.message_id)
    seen = texts_of(client, sent.message_id)
    assert seen[0]["payload"]["content_type"] == "text/markdown"
    assert "".join(m["payload"]["content"] for m in seen[1:-1]) == big + "end"
    assert sent.parts > 1 and end
    # what the server wrote, re-encoded the same compact way
    assert max(len(orjson.dumps(m)) for m in seen) <= 4096
    client.close()


@pytest.mark.parametrize("run_id,code", [(None, "SESSION_NOT_FOUND"), ("nope", "RUN_NOT_FOUND")])
def test_refused_before_anything_is_sent(session, run_id, code) -> None:
    server, client, sid = session
    target = "no-such-session" if code == "SESSION_NOT_FOUND" else sid
    with pytest.raises(ProtoError) as info:
        server.stream_text(target, model(3), run_id=run_id)
    assert info.value.code == code
    client.send("PING", "SYSTEM", {"nonce": "n"})
    client.recv_type("PONG", nonce="n")
    assert not [m for m in client.received if m["type"].startswith("MESSAGE_")]


def test_a_non_text_chunk_is_a_type_error_after_closing_the_text(session) -> None:
    server, client, sid = session
    with pytest.raises(TypeError):
        server.stream_text(sid, ["ok", 42])
    client.recv_type("MESSAGE_END")
