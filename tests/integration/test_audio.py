"""AUDIO_CHUNK end to end (docs/PROTOCOL.md §4.6, §5, §9) on every transport: validated, base64
decoded, the ``audioChunk`` event with the message and the bytes, byte credits spent on
AUDIO_IN, ``server.send_audio`` on AUDIO_OUT; binary WebSocket frames stay ``binary``."""

from __future__ import annotations

import base64
import queue

import orjson
import pytest

from protoflask import ProtoError, signals

from ..support import WSClient, wait_for

PCM = bytes(range(256)) * 4  # 1 KiB that is not UTF-8 text


def audio(data: bytes, message_id: str = "a1", final: bool = False, **extra) -> dict:
    return {"message_id": message_id, "mime": "audio/pcm",
            "data": base64.b64encode(data).decode(), "final": final, **extra}


def barrier(client) -> None:
    """Everything sent before is processed once the PONG is back."""
    nonce = f"b{client.envelopes.last_seq}"
    client.send("PING", "SYSTEM", {"nonce": nonce})
    client.recv_type("PONG", nonce=nonce)


def test_audio_chunk_raises_audio_chunk_with_the_decoded_bytes(make_server, make_client):
    server = make_server()
    chunks: queue.Queue = queue.Queue()
    signals.audio_chunk.connect(lambda sender, **kw: chunks.put(kw), sender=server, weak=False)
    positional: list = []
    server.on("audioChunk", lambda *args: positional.append(args))
    client = make_client(server, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    sent = client.send("AUDIO_CHUNK", "AUDIO_IN", audio(PCM[:500], "a1"))
    client.send("AUDIO_CHUNK", "AUDIO_IN", audio(PCM[500:], "a1", final=True))
    first, second = chunks.get(timeout=5), chunks.get(timeout=5)
    assert first["session_id"] == sid and first["data"] == PCM[:500]
    assert second["data"] == PCM[500:] and first["data"] + second["data"] == PCM
    message = first["message"]
    assert message["id"] == sent["id"] and message["type"] == "AUDIO_CHUNK"
    assert message["channel"] == "AUDIO_IN"
    assert message["payload"]["mime"] == "audio/pcm" and message["payload"]["final"] is False
    assert second["message"]["payload"]["final"] is True
    # server.on gets the spec's positional arguments (session_id, message)
    wait_for(lambda: len(positional) == 2, what="both positional audioChunk calls")
    assert positional[0] == (sid, message)
    barrier(client)
    assert not [m for m in client.received if m["type"] == "ERROR"]


@pytest.mark.parametrize("payload", [
    {"message_id": "a", "mime": "audio/pcm", "data": "not base64!"},
    {"message_id": "a", "mime": "audio/pcm", "data": "AAE"},  # bad padding
    {"message_id": "a", "mime": "audio/pcm"},  # no data
    {"message_id": "a", "data": "AAEC"},  # no mime
], ids=["alphabet", "padding", "no-data", "no-mime"])
def test_invalid_audio_chunk_is_invalid_message(make_server, make_client, payload):
    server = make_server()
    heard: list = []
    server.on("audioChunk", lambda *args: heard.append(args))
    client = make_client(server, server.issue_token("alice"))
    client.hello()
    sent = client.send("AUDIO_CHUNK", "AUDIO_IN", payload)
    error = client.expect_error("INVALID_MESSAGE")
    assert error["payload"]["related_id"] == sent["id"]
    barrier(client)
    assert heard == []


def test_audio_spends_byte_credits_on_audio_in(make_server, make_client):
    server = make_server(flowControl={"initialCreditBytes": 8192,
                                      "initialCreditMessages": 50, "creditThreshold": 0})
    heard: list = []
    server.on("audioChunk", lambda sid, message: heard.append(message["id"]))
    client = make_client(server, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    sent = client.send("AUDIO_CHUNK", "AUDIO_IN", audio(PCM[:1000]))
    barrier(client)
    size = len(orjson.dumps(sent))  # the encoded envelope, base64 overhead included
    session = server.get_session(sid)
    assert session["byteCredits"]["AUDIO_IN"] == 8192 - size
    assert session["credits"]["AUDIO_IN"] == 49
    assert session["byteCredits"].get("USER", 8192) == 8192  # other channels untouched

    # more than the channel has left: refused, not processed, nothing spent
    big = client.send("AUDIO_CHUNK", "AUDIO_IN", audio(PCM * 6, "a2"))
    error = client.expect_error("INSUFFICIENT_CREDITS")
    assert error["payload"]["related_id"] == big["id"]
    assert error["payload"]["detail"]["channel"] == "AUDIO_IN"
    assert error["payload"]["detail"]["needed_bytes"] == len(orjson.dumps(big))
    barrier(client)
    assert heard == [sent["id"]]
    assert server.get_session(sid)["byteCredits"]["AUDIO_IN"] == 8192 - size


def test_send_audio_sends_base64_chunks_on_audio_out(make_server, make_client):
    server = make_server()
    client = make_client(server, server.issue_token("alice"))
    sid = client.hello()["payload"]["session"]
    message_id = server.send_audio(sid, PCM[:600], "audio/pcm")
    assert server.send_audio(sid, PCM[600:], "audio/pcm", message_id=message_id,
                             final=True) == message_id
    first = client.recv_type("AUDIO_CHUNK")
    second = client.recv_type("AUDIO_CHUNK")
    for msg in (first, second):
        assert msg["channel"] == "AUDIO_OUT" and msg["session"] == sid
        assert msg["payload"]["message_id"] == message_id
        assert msg["payload"]["mime"] == "audio/pcm"
    assert (first["payload"]["final"], second["payload"]["final"]) == (False, True)
    data = b"".join(base64.b64decode(m["payload"]["data"], validate=True)
                    for m in (first, second))
    assert data == PCM
    assert int(second["seq"]) == int(first["seq"]) + 1
    # a fresh message_id per stream when none is given
    assert server.send_audio(sid, b"\x00", "audio/pcm") != message_id


def test_send_audio_refuses_bad_arguments(server):
    with pytest.raises(ProtoError) as info:
        server.send_audio("no-such-session", b"\x00", "audio/pcm")
    assert info.value.code == "SESSION_NOT_FOUND"
    with pytest.raises(TypeError):
        server.send_audio("no-such-session", "text is not audio", "audio/pcm")
    with pytest.raises(ValueError):
        server.send_audio("no-such-session", b"\x00", "")


def test_send_audio_respects_accept_events(make_server, make_client):
    server = make_server()
    client = make_client(server, server.issue_token("alice"))
    sid = client.hello(accept_events=["PONG"])["payload"]["session"]
    server.send_audio(sid, b"\x00\x01", "audio/pcm")
    barrier(client)
    assert not [m for m in client.received if m["type"] == "AUDIO_CHUNK"]


def test_binary_websocket_frames_raise_binary_not_audio(make_server):
    server = make_server()
    binary: queue.Queue = queue.Queue()
    audio_heard: list = []
    server.on("binary", lambda sid, data: binary.put((sid, data)))
    server.on("audioChunk", lambda *args: audio_heard.append(args))
    client = WSClient(server.base_url, server.issue_token("alice"))
    try:
        sid = client.hello()["payload"]["session"]
        before = server.get_session(sid)["byteCredits"]
        client.ws.send(PCM)
        assert binary.get(timeout=5) == (sid, PCM)
        barrier(client)
        assert audio_heard == []
        assert server.get_session(sid)["byteCredits"] == before  # not a protocol message
        assert not [m for m in client.received if m["type"] == "ERROR"]
    finally:
        client.close()

