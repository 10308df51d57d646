"""An MCP session's hold on its protoflask session in this process: a transport like the
others, whose "client" is the MCP endpoint itself. Like the transports it holds one
narrow thing, its ``port.SessionPort`` (attached, counted and closed through it), and
imports nothing else of the session layer (tests/test_layers.py).

Upstream, the endpoint's requests become envelopes the session receives exactly as a
WebSocket's (``send``): a tools/call is a TOOL_CALL, a cancellation a TOOL_CANCEL, so
schema checks, the queue, maxConcurrentRuns, stats and signals are the native ones.
Downstream, one greenlet takes what the session writes and hands each TOOL_UPDATE /
TOOL_DONE (and an ERROR that refused a call) to the request waiting for that call_id; it
answers the heartbeat's PING itself. The link ends when the engine closes it (another
process took the session, heartbeat, shutdown), on DELETE, or after ``idle_seconds``
without a request; the session is then kept for replayWindowTime like any other.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable

import gevent
import gevent.event
import gevent.lock
import gevent.queue
import orjson

from ..clock import now_ms

if TYPE_CHECKING:
    from ..port import SessionPort

log = logging.getLogger("protoflask.mcp")

#: What the session sends this link; anything else is filtered out by the session itself
ACCEPT_EVENTS = ["HELLO", "TOOL_UPDATE", "TOOL_DONE", "ERROR", "PING", "FLOW_UPDATE",
                 "PAUSE_CHANNEL", "RESUME_CHANNEL"]
#: ERROR codes that refuse a TOOL_CALL before it is accepted: no TOOL_DONE follows
REFUSALS = frozenset({"DUPLICATE_CALL_ID", "INSUFFICIENT_CREDITS", "CHANNEL_PAUSED",
                      "HANDSHAKE_REQUIRED", "INVALID_MESSAGE", "RATE_LIMITED",
                      "MESSAGE_TOO_LARGE"})
#: A waiting request is handed ("update", payload), ("done", payload),
#: ("refused", error payload) or ("closed", reason)
Item = tuple[str, Any]


class McpLink:
    """The transport an MCP session holds its protoflask session with, in this process."""

    kind = "mcp"
    #: (Writer) no reader greenlet pulls after its own calls: every ring wakes the pump
    reader = None

    def __init__(self, port: "SessionPort", idle_seconds: float,
                 on_end: Callable[["McpLink"], None]) -> None:
        self.port = port
        self.idle_seconds = idle_seconds
        self._on_end = on_end
        self.closed = False
        self._waiting: dict[str, gevent.queue.Queue[Item]] = {}
        #: set when the session has messages for the link (``wake``, the port's bell)
        self._wake = gevent.event.Event()
        #: taking what the session wrote can wait on Redis in a cluster: the pump and a
        #: request's own drain take turns, so messages are routed in the order written
        self._draining = gevent.lock.Semaphore()
        self._last_used = now_ms()
        self._greenlet = gevent.spawn(self._pump)

    @property
    def session_id(self) -> str:
        return self.port.id

    # -- Writer (what its port calls) -----------------------------------------------------

    def wake(self) -> None:
        """The session has messages for the link (run by the event loop)."""
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """The engine ends the link (or the link ends itself): every waiting request hears
        it; the connection slot is given back once."""
        if self.closed:
            return
        self.closed = True
        for queue in self._waiting.values():
            queue.put(("closed", reason))
        self._wake.set()
        gevent.spawn(self._end)

    def _end(self) -> None:
        try:
            self.port.end()
        finally:
            self._on_end(self)

    # -- upstream ---------------------------------------------------------------------------

    def send(self, type_: str, channel: str, payload: dict[str, Any],
             message_id: str | None = None) -> bool:
        """Hand the session one envelope, as a client's transport would; False (and
        nothing sent) for one over maxMessageSize, which the session would answer by
        closing its transport."""
        self._last_used = now_ms()
        port = self.port
        envelope = orjson.dumps({"id": message_id or uuid.uuid4().hex, "session": port.id,
                                 "seq": str(port.upstream_seq + 1), "ts": str(now_ms()),
                                 "type": type_, "channel": channel, "payload": payload})
        if len(envelope) > port.limits.max_message_size:
            return False
        port.receive(envelope)
        return True

    def hello(self) -> None:
        self.send("HELLO", "SYSTEM", {"proto_version": "1.1.2", "accept_major": [1],
                                      "accept_events": ACCEPT_EVENTS})

    def start_call(self, call_id: str, tool: str, params: Any) -> "gevent.queue.Queue[Item]":
        """Send a TOOL_CALL; the returned queue hears its updates and its end."""
        queue: gevent.queue.Queue[Item] = gevent.queue.Queue()
        if self.closed:
            queue.put(("closed", "the MCP session's link closed"))
            return queue
        for attempt in range(2):
            if not self.send("TOOL_CALL", "USER", {"call_id": call_id, "tool": tool,
                                                    "params": params}, message_id=call_id):
                queue.put(("refused", {"code": "MESSAGE_TOO_LARGE", "message":
                                       "the call's envelope exceeds maxMessageSize"}))
                return queue
            self._waiting[call_id] = queue
            self.drain()
            if attempt or queue.empty() or queue.peek()[0] != "refused" \
                    or queue.peek()[1].get("code") != "INSUFFICIENT_CREDITS":
                break
            # refused for byte credit while message credit was left: the refusal gave the
            # channel its bytes back (docs/PROTOCOL.md §5.1), so the call goes again once,
            # as a client that read the FLOW_UPDATE would send it
            queue.get()
        if queue.empty() and call_id not in self.port.open_calls:
            # the session took the message without opening the call or naming it in an
            # ERROR (a retransmitted seq, say): never leave the request waiting for nothing
            self._waiting.pop(call_id, None)
            queue.put(("refused", {"code": "INVALID_MESSAGE",
                                   "message": "the session did not accept the call"}))
        return queue

    def watch(self, call_id: str) -> "gevent.queue.Queue[Item] | None":
        """A queue that hears the end of a call already sent (a task's), or None when a
        request waits for it already."""
        if self.closed or call_id in self._waiting:
            return None
        queue: gevent.queue.Queue[Item] = gevent.queue.Queue()
        self._waiting[call_id] = queue
        return queue

    def forget(self, call_id: str) -> None:
        """The request waiting for ``call_id`` is gone (answered, or its client left)."""
        self._waiting.pop(call_id, None)
        self._last_used = now_ms()

    def cancel(self, call_id: str) -> None:
        self.send("TOOL_CANCEL", "USER", {"call_id": call_id})

    # -- downstream -------------------------------------------------------------------------

    def _pump(self) -> None:
        """The link's reader of the session's downstream when the session wakes it."""
        while not self.closed:
            self._wake.wait(timeout=self.idle_seconds / 4)
            self._wake.clear()
            if self.closed:
                break
            try:
                self.drain()
            except Exception:  # never leave a waiting request without its link
                log.exception("MCP link of session %s failed", self.port.id)
                self.close(1011, "MCP link failed")
                break
            if not self._waiting and now_ms() - self._last_used > self.idle_seconds * 1000:
                self.close(1000, "MCP session idle")

    def drain(self) -> None:
        """Route what the session has written. Also called by a request right after its
        TOOL_CALL: an inline tool has answered by then, and the answer need not wait for
        the pump's turn."""
        with self._draining:  # one reader at a time: a call's updates before its end
            ready = self.port.take_waiting()
            for _, data in ready:
                self._route(orjson.loads(data))
            if ready:
                self.port.written()

    def _route(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        payload = message.get("payload") or {}
        if kind == "TOOL_UPDATE" or kind == "TOOL_DONE":
            call_id = str(payload.get("call_id"))
            queue = self._waiting.get(call_id)
            if queue is not None:
                if kind == "TOOL_DONE":
                    del self._waiting[call_id]
                queue.put(("update" if kind == "TOOL_UPDATE" else "done", payload))
        elif kind == "ERROR":
            related = payload.get("related_id")
            if related in self._waiting and payload.get("code") in REFUSALS:
                self._waiting.pop(related).put(("refused", payload))
        elif kind == "PING":
            gevent.spawn(self._pong, payload.get("nonce"))

    def _pong(self, nonce: Any) -> None:
        if not self.closed:
            self.send("PONG", "SYSTEM", {"nonce": nonce})
