"""Builders for server-to-client messages.

A builder returns an ``Outbound``: type, channel and payload only. The session
stamps ``id``, ``session``, ``seq`` and ``ts`` when the message leaves its pending
queue (docs/PROTOCOL.md §2), so a builder's result can be sent to any session.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

import orjson

from .errors import InvalidMessage, ProtoError

PROTO_VERSION = "1.1.2"
SUPPORTED_MAJORS = (1,)


@dataclass(slots=True)
class Outbound:
    """A server message before the session stamps it.

    Not frozen (nothing assigns to one after it is built; one may go to many sessions):
    one is built for every message sent, and a frozen one cost twice as much to build
    (docs/PERFORMANCE.md p5-ping)."""

    type: str
    channel: str
    payload: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"type": self.type, "channel": self.channel, "payload": self.payload}
        if self.id is not None:
            out["id"] = self.id
        return out


def from_dict(message: Mapping[str, Any]) -> Outbound:
    """An application's message dict (at least type, channel, payload) as an Outbound."""
    if not isinstance(message, Mapping):
        raise InvalidMessage("a message must be a dict")
    mtype, channel = message.get("type"), message.get("channel")
    payload = message.get("payload", {})
    if not isinstance(mtype, str) or not mtype:
        raise InvalidMessage("message needs a string 'type'")
    if not isinstance(channel, str) or not channel:
        raise InvalidMessage("message needs a string 'channel'")
    if not isinstance(payload, Mapping):
        raise InvalidMessage("message 'payload' must be a dict")
    try:
        orjson.dumps(payload)
    except TypeError as exc:
        raise InvalidMessage(f"message payload is not JSON-serialisable: {exc}") from None
    mid = message.get("id")
    return Outbound(mtype, channel, dict(payload), mid if isinstance(mid, str) and mid else None)


def create(type: str, payload: Mapping[str, Any] | None = None,
           channel: str = "AGENT") -> Outbound:
    """Any message; ``channel`` defaults to AGENT, where the server answers."""
    return Outbound(type, channel, dict(payload or {}))


# -- control (SYSTEM) --------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _sorted(types: frozenset[str]) -> list[str]:
    return sorted(types)


def sorted_types(types: Iterable[str]) -> list[str]:
    """``sorted(types)``; made once per set of types when they come as a frozenset (every
    HELLO reply, issue 29). The list is shared: never changed."""
    return _sorted(types) if isinstance(types, frozenset) else sorted(types)


def hello(*, session_id: str, accept_events: Iterable[str], capabilities: dict[str, Any],
          last_client_seq: int) -> Outbound:
    return Outbound("HELLO", "SYSTEM", {
        "proto_version": PROTO_VERSION,
        "accept_major": list(SUPPORTED_MAJORS),
        "accept_events": sorted_types(accept_events),
        "session": session_id,
        "capabilities": capabilities,
        "last_client_seq": str(last_client_seq),
    })


def ping(nonce: str) -> Outbound:
    return Outbound("PING", "SYSTEM", {"nonce": nonce})


def pong(nonce: str) -> Outbound:
    return Outbound("PONG", "SYSTEM", {"nonce": nonce})


#: Largest ``detail`` an ERROR carries, in bytes of JSON. A larger one (the validation
#: errors of a huge payload) is replaced by ``{"truncated": true, "excerpt": <the first
#: MAX_DETAIL_BYTES bytes of its UTF-8 JSON, a character cut in half dropped>}``.
MAX_DETAIL_BYTES = 2048
#: Longest ERROR ``message``, in characters (longer ones are cut and end with "...").
MAX_ERROR_MESSAGE = 1024


def error(exc: ProtoError) -> Outbound:
    payload = exc.to_payload()
    if len(payload["message"]) > MAX_ERROR_MESSAGE:
        payload["message"] = payload["message"][:MAX_ERROR_MESSAGE - 3] + "..."
    detail = payload.get("detail")
    if detail is not None:
        try:
            encoded = orjson.dumps(detail, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            encoded = orjson.dumps(str(detail))
        if len(encoded) > MAX_DETAIL_BYTES:
            payload["detail"] = {"truncated": True, "excerpt": encoded[:MAX_DETAIL_BYTES]
                                 .decode("utf-8", "ignore")}
    return Outbound("ERROR", "SYSTEM", payload)


def flow_update(channel: str, add_messages: int, add_bytes: int) -> Outbound:
    return Outbound("FLOW_UPDATE", "SYSTEM",
                    {"channel": channel, "add_messages": add_messages, "add_bytes": add_bytes})


def pause_channel(channel: str) -> Outbound:
    return Outbound("PAUSE_CHANNEL", "SYSTEM", {"channel": channel})


def resume_channel(channel: str) -> Outbound:
    return Outbound("RESUME_CHANNEL", "SYSTEM", {"channel": channel})


def tool_list(tools: Iterable[Mapping[str, Any]]) -> Outbound:
    return Outbound("TOOL_LIST", "SYSTEM", {"tools": list(tools)})


# -- text (AGENT) --------------------------------------------------------------------------------


def text_start(message_id: str, content_type: str = "text/plain") -> Outbound:
    return Outbound("MESSAGE_START", "AGENT",
                    {"message_id": message_id, "content_type": content_type})


def text_part(message_id: str, content: str) -> Outbound:
    return Outbound("MESSAGE_PART", "AGENT", {"message_id": message_id, "content": content})


def split_text(message_id: str, text: str, room: int) -> list[str]:
    """``text`` cut into pieces whose MESSAGE_PART payload encodes to at most ``room``
    bytes (at least one character each; one piece, possibly empty, when it all fits)."""
    if (len(text) + len(message_id)) * 6 + 64 <= room:
        return [text]  # 6: the longest JSON escape of one character (the common case)
    overhead = len(orjson.dumps(text_part(message_id, "").payload))
    budget = max(1, room - overhead)
    if len(orjson.dumps(text)) - 2 <= budget:
        return [text]
    pieces: list[str] = []
    start, n = 0, len(text)
    while start < n:
        size = min(budget, n - start)
        while True:
            piece = text[start:start + size]
            encoded = len(orjson.dumps(piece)) - 2
            if encoded <= budget or size == 1:
                break
            size = max(1, min(size - 1, size * budget // encoded))
        pieces.append(piece)
        start += size
    return pieces


def text_end(message_id: str) -> Outbound:
    return Outbound("MESSAGE_END", "AGENT", {"message_id": message_id})


# -- tools and runs (AGENT) ----------------------------------------------------------------------

TOOL_UPDATE_STATUSES = ("QUEUED", "RUNNING")
TOOL_DONE_STATUSES = ("OK", "ERROR", "CANCELLED")


def tool_update(call_id: str, status: str, progress: float | None = None,
                partial: Any = None) -> Outbound:
    if status not in TOOL_UPDATE_STATUSES:
        raise ValueError(f"TOOL_UPDATE status must be one of {TOOL_UPDATE_STATUSES}")
    payload: dict[str, Any] = {"call_id": call_id, "status": status}
    if progress is not None:
        payload["progress"] = max(0, min(100, progress))
    if partial is not None:
        payload["partial"] = partial
    return Outbound("TOOL_UPDATE", "AGENT", payload)


def tool_done(call_id: str, status: str, result: Any = None,
              error: ProtoError | None = None) -> Outbound:
    if status not in TOOL_DONE_STATUSES:
        raise ValueError(f"TOOL_DONE status must be one of {TOOL_DONE_STATUSES}")
    payload: dict[str, Any] = {"call_id": call_id, "status": status}
    if result is not None:
        payload["result"] = result
    if error is not None:
        payload["error"] = {"code": error.code, "message": error.message}
        if error.detail is not None:  # e.g. the schema errors of refused params
            payload["error"]["detail"] = error.detail
    return Outbound("TOOL_DONE", "AGENT", payload)


def run_started(run_id: str, thread_id: str | None = None) -> Outbound:
    payload: dict[str, Any] = {"run_id": run_id}
    if thread_id is not None:
        payload["thread_id"] = thread_id
    return Outbound("RUN_STARTED", "AGENT", payload)


def run_finished(run_id: str, status: str, summary: Any = None, error: Any = None) -> Outbound:
    payload: dict[str, Any] = {"run_id": run_id, "status": status}
    if summary is not None:
        payload["summary"] = summary
    if error is not None:
        payload["error"] = error
    return Outbound("RUN_FINISHED", "AGENT", payload)


# -- audio (AUDIO_OUT) ---------------------------------------------------------------------------


def audio_chunk(message_id: str, mime: str, data: bytes | bytearray | memoryview,
                final: bool = False) -> Outbound:
    """AUDIO_CHUNK on AUDIO_OUT; ``data`` is raw bytes, base64-encoded here (PROTOCOL.md §4.6)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"audio data must be bytes, got {type(data).__name__}")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("an audio chunk needs a non-empty message_id")
    if not isinstance(mime, str) or not mime:
        raise ValueError("an audio chunk needs a mime type (e.g. 'audio/pcm')")
    return Outbound("AUDIO_CHUNK", "AUDIO_OUT", {
        "message_id": message_id, "mime": mime,
        "data": base64.b64encode(data).decode("ascii"), "final": bool(final)})
