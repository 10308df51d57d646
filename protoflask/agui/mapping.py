"""The mapping of a session's downstream messages to one AG-UI run's events, written once
(docs/AGUI.md, "Mapping").

A ``RunTranslator`` reads the stamped envelopes a session sends, in seq order, and returns
the AG-UI events of one run as SSE bytes: nothing before the run's own ``RUN_STARTED``,
nothing after its ``RUN_FINISHED``. Every event made from a message carries that
message's seq as its ``id:``; the events the translator makes up itself (the join
prelude of a re-attach, the ENDs that close what a cancelled run left open) carry none,
so a Last-Event-ID always names a message of the session.

A re-attach (``resume_after=N``) replays the run from its start: events up to seq ``N``
only update what is open (the client has them), then the join prelude re-opens the run
and every text and tool call still open at ``N``, so that a client's event verifier,
which starts from nothing, accepts what follows.
"""

from __future__ import annotations

from typing import Any

import orjson

#: The application's own message type that carries one AG-UI event, camelCase, verbatim
#: (state, custom events, frontend tool calls, a server tool call's announcement).
AGUI_EVENT = "AGUI_EVENT"
#: The CUSTOM event a server tool call's TOOL_UPDATE becomes.
PROGRESS_EVENT = "protoflask.tool_progress"

#: A text part as the session stamps it (core/outbound.py: orjson, the envelope's keys in a
#: fixed order, the payload last) is ``head, PART_HEAD, id, CONTENT_KEY, tail``, the tail
#: being the content and the two braces that close the payload and the envelope. The
#: content is already a JSON string, which is what the delta is: the fast paths
#: (``RunTranslator.translate_fast``, ``socket.SocketTranslator.translate_fast``) split
#: the envelope there (``partition``) and write the event around its bytes, without
#: decoding it, when the id's JSON text is an open text's (``RunTranslator.texts``) and the
#: tail is one string and its braces (``is_part_tail``); anything else goes through the
#: mapping (docs/PERFORMANCE.md, AG-UI). The first PART_HEAD may be in the payload of
#: another message, but never with such a tail (a part nested in a payload is followed by
#: more than two braces), so the head is the envelope's up to its "type" key; the id's
#: JSON text ends at the first CONTENT_KEY (an escaped string never holds ``","``).
PART_HEAD = b'"type":"MESSAGE_PART","channel":"AGENT","payload":{"message_id":"'
CONTENT_KEY = b'","content":'
#: the SSE event of a text part: (seq, the id's JSON text, the content's)
_CONTENT = b'id: %d\ndata: {"type":"TEXT_MESSAGE_CONTENT","messageId":"%s","delta":%s}\n\n'


def is_part_tail(tail: bytes) -> bool:
    """Whether a part's ``tail`` (what follows its ``"content":``) is one JSON string and
    the two braces that close the payload and the envelope: it starts and ends with a
    quote and holds no other quote that is not escaped. (The fast paths test the common
    case first: a quote before the braces and none but the two. A quote after an escaped
    backslash counts as escaped here, which only sends such a part the slow way.)"""
    return tail[:1] == b'"' and tail.endswith(b'"}}') and \
        tail.count(b'"') - tail.count(b'\\"') == 2


def text_key(key: str) -> bytes:
    """An open text's id as a stamped envelope carries it: its JSON text, unquoted."""
    return orjson.dumps(key)[1:-1]


_OPENS = {"TEXT_MESSAGE_START": "text", "TOOL_CALL_START": "tool"}
_CLOSES = {"TEXT_MESSAGE_END": "text", "TOOL_CALL_END": "tool"}
_KEY = {"text": "messageId", "tool": "toolCallId"}


def sse_event(event: dict[str, Any], seq: int | None) -> bytes:
    """One AG-UI event in AG-UI's SSE framing: one ``data:`` line, LF; ``id:`` first."""
    data = orjson.dumps(event)
    if seq is None:
        return b"data: " + data + b"\n\n"
    return b"id: %d\ndata: %s\n\n" % (seq, data)


class SseFraming:
    """Events as AG-UI's HTTP binding writes them (``/proto/agui``)."""

    #: the heartbeat's PINGs are the stream's to answer (an AG-UI client knows nothing
    #: of them)
    answers_pings = True

    @staticmethod
    def event(event: dict[str, Any], seq: int | None, data: bytes) -> bytes:
        return sse_event(event, seq)


#: The native envelope an AG-UI event travels in on the WebSocket (docs/AGUI.md, "AG-UI
#: events on the WebSocket"): the head of the message it was made from (id, session, seq,
#: ts), then these keys, then the event.
_AGUI_ENVELOPE = b'"type":"AGUI_EVENT","channel":"AGENT","payload":'
#: a text part's envelope: (its head, the id's JSON text, the content's and the braces)
SOCKET_CONTENT = b'%s' + _AGUI_ENVELOPE + \
    b'{"type":"TEXT_MESSAGE_CONTENT","messageId":"%s","delta":%s'


def _head(data: bytes) -> bytes:
    """A stamped envelope up to its "type" key: ``{"id":..,"session":..,"seq":..,"ts":..,``
    (the first ``"type":`` is the key: in a JSON string a quote is escaped)."""
    return data[:data.find(b'"type":')]


class SocketFraming:
    """Events as native ``AGUI_EVENT`` envelopes, one a frame, carrying the seq of the
    message each was made from; an event the translator makes up has no seq (nor id,
    session, ts): ``{"type": "AGUI_EVENT", "channel": "AGENT", "payload": event}``."""

    answers_pings = False  # the native client answers them itself

    @staticmethod
    def event(event: dict[str, Any], seq: int | None, data: bytes) -> bytes:
        body = _AGUI_ENVELOPE + orjson.dumps(event) + b"}"
        return _head(data) + body if seq is not None else b"{" + body


SSE = SseFraming()
SOCKET = SocketFraming()


class RunTranslator:
    """The AG-UI events of run ``run_id`` of thread ``thread_id`` (see the module doc),
    framed by ``framing`` (SSE for ``/proto/agui``, SOCKET for the WebSocket)."""

    def __init__(self, thread_id: str, run_id: str, resume_after: int | None = None,
                 framing: SseFraming | SocketFraming = SSE) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.framing = framing
        self.started = False
        self.ended = False
        #: seqs up to this one are not written (a re-attach: the client has them)
        self.resume_after = resume_after
        #: open constructs, in the order they opened: (kind, id) -> the START event
        self.open: dict[tuple[str, str], dict[str, Any]] = {}
        #: the open texts' ids as their parts' envelopes carry them (``text_key``): what
        #: the fast paths look a part's id up in
        self.texts: set[bytes] = set()
        #: tool calls announced in this run whose result has not come (a server tool's
        #: TOOL_DONE becomes TOOL_CALL_RESULT; a frontend tool's result comes next run)
        self.calls: set[str] = set()
        #: the nonces of the heartbeat PINGs read, for the stream to answer
        self.pings: list[str] = []
        #: the envelope being translated (SocketFraming keeps its head)
        self._data = b""

    def translate_plain(self, ready: list[tuple[int, bytes]]) -> bytes:
        """The SSE stream's bytes for ``ready``: each message through ``feed`` (the
        definition ``translate_fast`` is held equal to, tests/agui/test_fastpath.py)."""
        out: list[bytes] = []
        for seq, data in ready:
            if self.ended:
                break
            self.feed(seq, data, out)
        return b"".join(out)

    def translate_fast(self, ready: list[tuple[int, bytes]]) -> bytes:
        """``translate_plain``, with a text part of an open text written around its
        envelope's bytes (the module doc): the SSE stream's hot path, no call per part."""
        out: list[bytes] = []
        texts = self.texts
        for seq, data in ready:
            if self.ended:
                break
            if texts and self.resume_after is None:
                _, found, rest = data.partition(PART_HEAD)
                if found:
                    mid, _, tail = rest.partition(CONTENT_KEY)
                    # is_part_tail's common case (no quote in the content) first
                    if mid in texts and tail and (tail[-3] == 34 and tail.count(b'"') == 2
                                                  or is_part_tail(tail)):
                        out.append(_CONTENT % (seq, mid, tail[:-2]))
                        continue
            self.feed(seq, data, out)
        return b"".join(out)

    #: The swap point: what the SSE stream calls.
    translate = translate_fast

    def feed(self, seq: int, data: bytes, out: list[bytes], write: bool = True) -> bool:
        """Translate one stamped message into ``out``; False if it is none of the run's
        (nothing written: the WebSocket sends it as it is)."""
        resume = self.resume_after
        if resume is not None and seq > resume:
            self._prelude(out)
            resume = None
        self._data = data
        taken = self._message(seq, orjson.loads(data), out, write and resume is None)
        if resume is not None and seq >= resume:
            self._prelude(out)
        return taken

    # -- one message -------------------------------------------------------------------

    def _message(self, seq: int, env: dict[str, Any], out: list[bytes], write: bool) -> bool:
        mtype = env.get("type")
        payload = env.get("payload") or {}
        if mtype == "PING":
            if self.framing.answers_pings:
                self.pings.append(str(payload.get("nonce", "")))
            return False
        if not self.started:
            if mtype == "RUN_STARTED" and payload.get("run_id") == self.run_id:
                self.started = True
                self._emit({"type": "RUN_STARTED", "threadId": self.thread_id,
                            "runId": self.run_id}, seq, out, write)
                return True
            return False
        if self.ended:
            return False
        if mtype == "MESSAGE_PART":
            mid = payload.get("message_id")
            if ("text", mid) not in self.open:
                return False
            self._emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid,
                        "delta": payload.get("content", "")}, seq, out, write)
        elif mtype == AGUI_EVENT:
            self._emit(payload, seq, out, write)
        elif mtype == "MESSAGE_START":
            self._emit({"type": "TEXT_MESSAGE_START", "messageId": payload.get("message_id"),
                        "role": "assistant"}, seq, out, write)
        elif mtype == "MESSAGE_END":
            mid = payload.get("message_id")
            if ("text", mid) not in self.open:
                return False
            self._emit({"type": "TEXT_MESSAGE_END", "messageId": mid}, seq, out, write)
        elif mtype == "TOOL_UPDATE":
            call_id = payload.get("call_id")
            if call_id not in self.calls:
                return False
            self._emit({"type": "CUSTOM", "name": PROGRESS_EVENT,
                        "value": progress_value(call_id, payload)}, seq, out, write)
        elif mtype == "TOOL_DONE":
            call_id = payload.get("call_id")
            if call_id not in self.calls:
                return False
            self.calls.discard(call_id)
            self._emit({"type": "TOOL_CALL_RESULT", "messageId": f"{call_id}-result",
                        "toolCallId": call_id, "role": "tool",
                        "content": result_content(payload)}, seq, out, write)
        elif mtype == "RUN_FINISHED" and payload.get("run_id") == self.run_id:
            self._finish(seq, payload, out, write)
        else:
            return False
        return True

    def _emit(self, event: dict[str, Any], seq: int | None, out: list[bytes],
              write: bool) -> None:
        etype = event.get("type")
        kind = _OPENS.get(etype)  # type: ignore[arg-type]
        if kind is not None:
            key = str(event.get(_KEY[kind]))
            self.open[(kind, key)] = event
            if kind == "tool":  # a native TOOL_DONE of this id is its result
                self.calls.add(key)
            else:
                self.texts.add(text_key(key))
        else:
            kind = _CLOSES.get(etype)  # type: ignore[arg-type]
            if kind is not None:
                key = str(event.get(_KEY[kind]))
                self.open.pop((kind, key), None)
                if kind == "text":
                    self.texts.discard(text_key(key))
        if write:
            out.append(self.framing.event(event, seq, self._data))

    def _finish(self, seq: int, payload: dict[str, Any], out: list[bytes],
                write: bool) -> None:
        """The run's end: close what is open (id-less), then the one terminal event."""
        for (kind, key), _ in list(self.open.items()):
            end = "TEXT_MESSAGE_END" if kind == "text" else "TOOL_CALL_END"
            self._emit({"type": end, _KEY[kind]: key}, None, out, write)
        status = payload.get("status")
        terminal: dict[str, Any]
        if status == "error":
            error = payload.get("error")
            message, code = _error_text(error)
            terminal = {"type": "RUN_ERROR", "message": message}
            if code:
                terminal["code"] = code
        else:
            terminal = {"type": "RUN_FINISHED", "threadId": self.thread_id,
                        "runId": self.run_id}
            if status == "cancelled":
                terminal["outcome"] = {"type": "cancelled"}
            elif payload.get("summary") is not None:
                terminal["result"] = payload["summary"]
        self._emit(terminal, seq, out, write)
        self.ended = True

    def _prelude(self, out: list[bytes]) -> None:
        """A re-attach reached the client's Last-Event-ID: re-open the run and what is
        open in it (id-less), unless the client has the run's end already."""
        self.resume_after = None
        if not self.started or self.ended:
            return
        framing = self.framing
        out.append(framing.event({"type": "RUN_STARTED", "threadId": self.thread_id,
                                  "runId": self.run_id}, None, b""))
        for event in self.open.values():
            out.append(framing.event(event, None, b""))


def progress_value(call_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The value of a tool's progress event: its TOOL_UPDATE, camelCase."""
    value: dict[str, Any] = {"toolCallId": call_id, "status": payload.get("status")}
    if payload.get("progress") is not None:
        value["progress"] = payload["progress"]
    if "partial" in payload:
        value["partial"] = payload["partial"]
    return value


def result_content(payload: dict[str, Any]) -> str:
    """TOOL_CALL_RESULT's content: the tool's result as JSON text; a failed call's
    ``{"error": {code, message}}``, a cancelled one's ``{"cancelled": true}``."""
    status = payload.get("status")
    if status == "OK":
        return orjson.dumps(payload.get("result")).decode()
    if status == "CANCELLED":
        return '{"cancelled":true}'
    return orjson.dumps({"error": payload.get("error")}).decode()


def _error_text(error: Any) -> tuple[str, str | None]:
    if isinstance(error, dict):
        code = error.get("code")
        return str(error.get("message") or code or "run failed"), \
            (str(code) if code else None)
    return (str(error) if error is not None else "run failed"), None
