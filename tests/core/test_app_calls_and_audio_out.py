"""The application's side of the core added for agents and audio: calls it opens itself
(``open_call``) and the AUDIO_OUT builder."""

from __future__ import annotations

import base64

import pytest

from protoflask.core import messages
from protoflask.core.errors import DuplicateCallId, RunNotFound, ToolExecutionError
from protoflask.core.session import RunChanged

from ._support import types


def test_an_opened_call_gets_updates_and_one_done(client):
    s = client.s
    assert s.work.tool_update("a1", "RUNNING", 10) is False  # unknown until opened
    s.work.open_call("a1")
    assert s.work.tool_update("a1", "RUNNING", 10) is True
    assert s.work.tool_done("a1", "OK", {"x": 1}) is True
    assert s.work.tool_done("a1", "OK", {"x": 1}) is False
    out = client.take()
    assert types(out) == ["TOOL_UPDATE", "TOOL_DONE"]
    assert out[1]["payload"] == {"call_id": "a1", "status": "OK", "result": {"x": 1}}


def test_open_call_refuses_a_running_id_and_an_inactive_run(client):
    s = client.s
    s.work.open_call("a1")
    with pytest.raises(DuplicateCallId):
        s.work.open_call("a1")
    client.send("TOOL_CALL", {"call_id": "c1", "tool": "echo", "params": {}})
    with pytest.raises(DuplicateCallId):
        s.work.open_call("c1")  # a client's running call too
    with pytest.raises(RunNotFound):
        s.work.open_call("a2", run_id="nope")
    assert "a2" not in s.calls


def test_cancelling_a_run_lists_the_calls_opened_in_it(client):
    s = client.s
    run = s.work.start_run(0, run_id="r1")
    s.work.open_call("a1", run_id=run.run_id)
    s.work.open_call("a2")
    s.take_events()
    s.work.cancel_run("r1", 0)
    (changed,) = [e for e in s.take_events() if isinstance(e, RunChanged)]
    assert changed.kind == "cancelled" and changed.cancelled_calls == ("a1",)


def test_a_failed_opened_call_has_no_related_id(client):
    client.s.work.open_call("a1")
    client.s.work.fail_call("a1", ToolExecutionError("boom"))
    done, error = client.take()
    assert done["payload"]["status"] == "ERROR"
    assert error["payload"] == {"code": "TOOL_EXECUTION_ERROR", "message": "boom"}


def test_audio_chunk_builder():
    out = messages.audio_chunk("m1", "audio/pcm", b"\x00\xff\x10")
    assert (out.type, out.channel) == ("AUDIO_CHUNK", "AUDIO_OUT")
    assert out.payload == {"message_id": "m1", "mime": "audio/pcm",
                           "data": base64.b64encode(b"\x00\xff\x10").decode(), "final": False}
    assert messages.audio_chunk("m1", "audio/pcm", bytearray(b"a"), final=True).payload["final"]
    assert messages.audio_chunk("m1", "audio/pcm", memoryview(b"ab")).payload["data"] == "YWI="
    with pytest.raises(TypeError):
        messages.audio_chunk("m1", "audio/pcm", "text")
    with pytest.raises(ValueError):
        messages.audio_chunk("", "audio/pcm", b"a")
    with pytest.raises(ValueError):
        messages.audio_chunk("m1", "", b"a")


def test_audio_out_waits_while_the_client_paused_it(client):
    s = client.s
    client.send("PAUSE_CHANNEL", {"channel": "AUDIO_OUT"})
    s.send(messages.audio_chunk("m1", "audio/pcm", b"\x01"))
    assert client.take() == []  # held while AUDIO_OUT is paused
    client.send("RESUME_CHANNEL", {"channel": "AUDIO_OUT"})
    (chunk,) = client.take()
    assert chunk["channel"] == "AUDIO_OUT" and chunk["payload"]["data"] == "AQ=="
