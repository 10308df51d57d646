"""The client's reader: each downstream frame, parsed and handed to whoever waits for it.

``Receiver`` is the part of ``Client`` that the transport's reader thread runs; every
handler runs under the client's lock and says whether the message was consumed (False:
nobody here waited for it, and it goes to the inbox).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from ..core.envelope import CONTROL_TYPES, decode_json
from ..core.errors import InvalidMessage
from ._downstream import Downstream, Text
from ._requests import Requests, Waiter
from ._upstream import UpstreamQueue


class Receiver:
    # what the reader shares with the rest of the Client (set by Client.__init__)
    _wake: threading.Condition
    _conn: Any
    _up: UpstreamQueue
    _down: Downstream
    _requests: Requests
    _ready: bool
    _hello: Waiter | None
    _dirty: bool
    session_id: str | None
    server_hello: dict[str, Any] | None
    downstream_credit: bool
    on_message: Callable[[dict[str, Any]], None] | None
    on_text_part: Callable[[str, str], None] | None
    texts: "queue.Queue[Any]"
    inbox: "queue.Queue[Any]"

    def _poke(self) -> None:
        """Under the lock: something changed that the writer (or flush) must look at."""
        self._dirty = True
        self._wake.notify_all()

    def _ack(self) -> None:
        self._up.control_message("ACK", self._down.ack())
        self._poke()

    def _on_frame(self, conn: Any, data: bytes) -> None:
        # Parsed leniently: applications may send on channels of their own, which the
        # client's envelope schema (core.envelope) would refuse.
        try:
            msg = decode_json(data)
            seq = int(msg["seq"])
            mtype, channel, payload = msg["type"], msg["channel"], msg["payload"]
        except (InvalidMessage, KeyError, TypeError, ValueError):
            return  # not an envelope: nothing a client can do with it
        with self._wake:
            if conn is not self._conn or not self._down.deliver(seq, mtype in ("PING", "PONG")):
                return  # a stale connection, or already delivered before a resume
            if mtype not in CONTROL_TYPES and self.downstream_credit:
                update = self._down.spend(channel, len(data))
                if update is not None:
                    self._up.control_message("FLOW_UPDATE", update)
                    self._poke()
            if self._down.ack_due:
                self._ack()
            handler = _HANDLERS.get(mtype)
            consumed = handler(self, payload, msg) if handler is not None else False
        if self.on_message is not None:
            self.on_message(msg)
        if not consumed:
            self.inbox.put(msg)

    def _on_hello(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        if self.server_hello is None:
            self.server_hello = p
            self.session_id = p.get("session") or self.session_id
            self._up.on_first_hello(p.get("capabilities", {}).get("flow_control", {}))
        self._up.on_hello(int(p.get("last_client_seq", 0)))
        self._down.restart_grants()
        self._ready = True
        self._poke()
        if self._hello is not None:
            self._hello.resolve(p)
        return True

    def _on_ping(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        self._up.control_message("PONG", {"nonce": p.get("nonce", "")})
        self._poke()
        return True

    def _on_pong(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        ping, grew = self._up.on_pong(p.get("nonce"))
        if ping is None:
            return False
        if grew:
            self._poke()
        waiter, _, sent_at = ping
        waiter.resolve(time.monotonic() - sent_at)
        return True

    def _on_flow_update(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        self._up.on_flow_update(p)
        self._poke()
        return True

    def _on_pause(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        channel = p.get("channel", "")
        if msg["type"] == "PAUSE_CHANNEL":
            self._up.on_pause(channel)
        else:
            self._up.on_resume(channel)
            self._poke()
        return True

    def _on_text(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        done = self._down.on_text(msg["type"], p, msg["channel"], self.on_text_part)
        if isinstance(done, Text):
            self.texts.put(done)
            return True
        return done

    def _on_tool_update(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        return self._requests.on_tool_update(p)

    def _on_tool_done(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        return self._requests.on_tool_done(p)

    def _on_tool_list(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        return self._requests.on_tool_list(p)

    def _on_run_started(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        return self._requests.on_run_started(p)

    def _on_run_finished(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        return self._requests.on_run_finished(p)

    def _on_error(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        related = p.get("related_id")
        if self._up.on_refusal(p.get("code", "ERROR"), related):
            return True  # not processed: sent again once the channel is resumed
        return self._requests.on_error(p, related)


_HANDLERS: dict[str, Callable[[Receiver, dict[str, Any], dict[str, Any]], bool]] = {
    "HELLO": Receiver._on_hello,
    "PING": Receiver._on_ping,
    "PONG": Receiver._on_pong,
    "FLOW_UPDATE": Receiver._on_flow_update,
    "PAUSE_CHANNEL": Receiver._on_pause,
    "RESUME_CHANNEL": Receiver._on_pause,
    "MESSAGE_START": Receiver._on_text,
    "MESSAGE_PART": Receiver._on_text,
    "MESSAGE_END": Receiver._on_text,
    "TOOL_UPDATE": Receiver._on_tool_update,
    "TOOL_DONE": Receiver._on_tool_done,
    "TOOL_LIST": Receiver._on_tool_list,
    "RUN_STARTED": Receiver._on_run_started,
    "RUN_FINISHED": Receiver._on_run_finished,
    "ERROR": Receiver._on_error,
}
