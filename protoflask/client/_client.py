"""The client: one session over any transport, kept alive across dropped connections.

Threads (greenlets when gevent has monkey-patched the program):

- the transport's reader calls ``_on_frame`` for each downstream message;
- one writer sends upstream messages in seq order (control messages first, data
  messages only within the server's credit and not on a channel it paused);
- a reconnect thread, only while the connection is lost.

The session's state lives in three sans-I/O pieces the Client drives under its lock:
``_upstream.UpstreamQueue`` (seqs, send queues, credit, confirmation, back-pressure),
``_downstream.Downstream`` (delivered seqs, the credit the client grants, texts) and
``_requests.Requests`` (tool calls, runs and tool lists waiting for answers).

Exactly once, downstream (docs/PROTOCOL.md §2, §8): every message has a session seq; the
client remembers the last one it delivered, drops anything at or below it, and resumes
with ``last_seq`` = that seq. Downstream credit: the client asks for it in HELLO
(``flow_control.downstream: true``, unless ``downstream_credit=False``) and tops each
channel up with FLOW_UPDATE when half is spent; a re-HELLO after a resume resets the
server's view of it, so a FLOW_UPDATE lost with a connection costs nothing.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any, Callable, Iterable

from ..core.envelope import CONTROL_TYPES, encode
from ..core.errors import CloseCode
from ..core.messages import PROTO_VERSION
from ..core.outbound import ENVELOPE_OVERHEAD
from ._downstream import Downstream, Text
from ._http import BaseURL
from ._receive import Receiver
from ._requests import ProgressHandler, Requests, ToolCall, Waiter
from ._sse import SSEConnection
from ._stream import StreamConnection
from ._upstream import Entry, UpstreamQueue
from ._ws import WSConnection
from .errors import ClientTimeout, ConnectionLost, ConnectionRefused, ProtoClientError

TRANSPORTS: dict[str, type] = {
    "ws": WSConnection, "websocket": WSConnection,
    "sse": SSEConnection,
    "stream": StreamConnection, "http": StreamConnection,
}
#: Close codes after which reconnecting would be wrong (docs/PROTOCOL.md §6.2 Close codes).
_FINAL_CLOSES: dict[int, str] = {
    c: c.name for c in (CloseCode.UNSUPPORTED_VERSION, CloseCode.SUPERSEDED)}
#: HTTP refusals that no retry will fix: the token or the session is gone.
_FINAL_STATUSES = {400, 401, 403, 404, 413}
#: What the client itself needs to receive, added to a non-empty ``accept_events``.
_NEEDED_EVENTS = ("PONG", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL")
#: ``send`` waits while this many data messages are queued.
_MAX_QUEUED = 1000
_ENDED = object()

__all__ = ["Client", "Text", "ToolCall", "connect"]


def _now_ms() -> int:
    return int(time.time() * 1000)


class Client(Receiver):
    """A protoflask session over WebSocket (``ws``), SSE (``sse``) or the NDJSON HTTP
    stream (``stream``). See docs/CLIENT.md."""

    def __init__(self, url: str = "http://127.0.0.1:8080", token: str | None = None, *,
                 transport: str = "ws", accept_events: Iterable[str] = (),
                 credit_messages: int = 1000, credit_bytes: int = 16 * 1024 * 1024,
                 downstream_credit: bool = True,
                 reconnect: bool = True, reconnect_timeout: float | None = None,
                 timeout: float = 10.0,
                 on_message: Callable[[dict[str, Any]], None] | None = None,
                 on_text_part: Callable[[str, str], None] | None = None) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; use ws, sse or stream")
        self.base = BaseURL(url)
        self.token = token
        self.transport = transport
        wanted = list(accept_events)
        self.accept_events = wanted + [t for t in _NEEDED_EVENTS if t not in wanted] \
            if wanted else []
        self.credit_messages, self.credit_bytes = credit_messages, credit_bytes
        self.downstream_credit = downstream_credit
        self.reconnect, self.timeout = reconnect, timeout
        self.reconnect_timeout = reconnect_timeout
        self.on_message, self.on_text_part = on_message, on_text_part
        self.session_id: str | None = None
        self.server_hello: dict[str, Any] | None = None  # the first HELLO reply's payload
        self.reconnects = 0  # connections re-established (for callers and tests)
        self.texts: "queue.Queue[Any]" = queue.Queue()
        self.inbox: "queue.Queue[Any]" = queue.Queue()

        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._send_lock = threading.Lock()  # seq assignment + transmission, and reconnects
        self._up = UpstreamQueue(uuid.uuid4().hex[:8])
        self._down = Downstream(credit_messages, credit_bytes)
        self._requests = Requests()
        self._conn: Any = None
        self._ready = False  # the current connection's HELLO was answered
        self._hello: Waiter | None = None
        self._closed = False
        self._fatal: ProtoClientError | None = None
        self._writing = False
        self._dirty = False  # set with every wake-up, so the writer cannot miss one
        self._writer = threading.Thread(target=self._write_loop, name="protoflask-writer",
                                        daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def connect(self) -> "Client":
        """Open the connection and complete the handshake; raises ConnectionRefused
        (with the HTTP status and the contract code) or ConnectionFailed."""
        self._writer.start()
        try:
            self._open(resume=False)
        except BaseException:
            with self._lock:
                self._closed = True
                self._poke()
            raise
        hello = self._hello
        assert hello is not None
        try:
            hello.wait(self.timeout, "HELLO")
        except ClientTimeout:
            self.close()
            raise
        return self

    def close(self, flush_timeout: float = 5.0) -> None:
        """Send what is queued (up to ``flush_timeout`` s), then end the session's
        connection. The server keeps the session for ``replayWindowTime``."""
        if self._fatal is None and not self._closed:
            try:
                self.flush(flush_timeout)
            except ProtoClientError:
                pass
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            self._fail_all(ConnectionLost("CLOSED", "the client was closed"))
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def __enter__(self) -> "Client":
        return self.connect() if self._hello is None else self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message has been written."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            while not self._up.empty or self._writing:
                self._check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ClientTimeout(f"queued messages not sent within {timeout}s")
                self._wake.wait(0.05 if left is None else min(left, 0.05))

    def drop_connection(self) -> None:
        """Lose the current connection abruptly, as a network failure would; the client
        reconnects and resumes (for tests and drills)."""
        conn = self._conn
        if conn is not None:
            conn.abort()

    @property
    def connected(self) -> bool:
        return self._ready and not self._closed

    @property
    def last_seq(self) -> int:
        """The last downstream seq delivered."""
        return self._down.last_seq

    @property
    def _seq(self) -> int:
        """The last upstream seq assigned (tests and bench/flow_probe.py count with it)."""
        return self._up.seq

    # -- sending --------------------------------------------------------------------------

    def send(self, type: str, channel: str = "USER",
             payload: dict[str, Any] | None = None) -> str:
        """Queue any message; returns its envelope id (an ERROR about it names it as
        ``related_id``). Data messages wait for credit; this waits only while more than
        1000 of them are queued."""
        entry = Entry(type, channel, dict(payload or {}), self._up.next_id())
        limit = (self.server_hello or {}).get("capabilities", {}).get("max_message_size")
        # the server's own estimate of an envelope's size (core.outbound.ENVELOPE_OVERHEAD)
        if limit and len(encode(entry.payload)) + ENVELOPE_OVERHEAD > limit:
            raise ProtoClientError("MESSAGE_TOO_LARGE",
                                   f"a {type} this large exceeds the server's {limit} bytes")
        with self._wake:
            self._check()
            if type in CONTROL_TYPES:
                self._up.control.append(entry)
            else:
                while len(self._up.data) >= _MAX_QUEUED:
                    self._wake.wait(0.1)
                    self._check()
                self._up.data.append(entry)
            self._poke()
        return entry.id

    def send_text(self, text: str | Iterable[str], content_type: str = "text/plain",
                  message_id: str | None = None) -> str:
        """A whole text (a string, or an iterable of parts streamed as they come):
        MESSAGE_START, a MESSAGE_PART per part, MESSAGE_END. Returns the message_id."""
        mid = message_id or self._up.next_id("m")
        self.send("MESSAGE_START", "USER", {"message_id": mid, "content_type": content_type})
        for part in ([text] if isinstance(text, str) else text):
            self.send("MESSAGE_PART", "USER", {"message_id": mid, "content": part})
        self.send("MESSAGE_END", "USER", {"message_id": mid})
        return mid

    def next_text(self, timeout: float | None = None) -> Text:
        """The next text the server sent, assembled; raises ClientTimeout."""
        return self._take(self.texts, timeout, "a text")

    def next_message(self, timeout: float | None = None) -> dict[str, Any]:
        """The next server message no request of this client consumed (agent runs and
        tool calls, ERRORs about nothing we asked, audio...)."""
        return self._take(self.inbox, timeout, "a message")

    def call_tool_async(self, tool: str, params: dict[str, Any] | None = None, *,
                        on_progress: ProgressHandler | None = None,
                        run_id: str | None = None, call_id: str | None = None) -> ToolCall:
        """Start a tool call; ``on_progress(progress, status, partial)`` is called for each
        TOOL_UPDATE (from the reader thread: keep it short)."""
        call_id = call_id or self._up.next_id("call")
        call = ToolCall(self, call_id, tool, on_progress)
        payload: dict[str, Any] = {"call_id": call_id, "tool": tool, "params": params or {}}
        if run_id is not None:
            payload["run_id"] = run_id
        with self._lock:
            self._requests.calls[call_id] = call
            self._requests.by_envelope[self.send("TOOL_CALL", "USER", payload)] = call
        return call

    def call_tool(self, tool: str, params: dict[str, Any] | None = None, *,
                  on_progress: ProgressHandler | None = None,
                  run_id: str | None = None, timeout: float | None = None) -> Any:
        """Call a tool and return its result; raises ToolError with the contract code
        (``TOOL_NOT_FOUND``, ``INVALID_MESSAGE``, ``TOOL_EXECUTION_ERROR``...)."""
        return self.call_tool_async(tool, params, on_progress=on_progress,
                                    run_id=run_id).result(timeout)

    def list_tools(self, timeout: float | None = None) -> list[dict[str, Any]]:
        waiter = Waiter()
        with self._lock:
            self._requests.tool_lists.append(waiter)
            self._requests.by_envelope[self.send("TOOL_LIST", "SYSTEM", {})] = waiter
        return waiter.wait(self._t(timeout), "TOOL_LIST")

    def start_run(self, run_id: str | None = None, *, thread_id: str | None = None,
                  metadata: Any = None, timeout: float | None = None) -> str:
        """RUN_STARTED; returns the run_id (generated here when not given)."""
        run_id = run_id or self._up.next_id("run")
        payload: dict[str, Any] = {"run_id": run_id}
        if thread_id is not None:
            payload["thread_id"] = thread_id
        if metadata is not None:
            payload["metadata"] = metadata
        waiter = Waiter()
        with self._lock:
            self._requests.runs_started[run_id] = waiter
            self._requests.by_envelope[self.send("RUN_STARTED", "USER", payload)] = waiter
        waiter.wait(self._t(timeout), f"RUN_STARTED {run_id}")
        return run_id

    def finish_run(self, run_id: str, summary: Any = None, *,
                   timeout: float | None = None) -> dict[str, Any]:
        """RUN_FINISHED; returns the server's RUN_FINISHED payload."""
        payload: dict[str, Any] = {"run_id": run_id}
        if summary is not None:
            payload["summary"] = summary
        return self._end_run("RUN_FINISHED", payload, timeout)

    def cancel_run(self, run_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """RUN_CANCEL (its tool calls are cancelled too); returns RUN_FINISHED's payload."""
        return self._end_run("RUN_CANCEL", {"run_id": run_id}, timeout)

    def _end_run(self, type: str, payload: dict[str, Any], timeout: float | None) -> Any:
        waiter = Waiter()
        with self._lock:
            self._requests.runs_ended[payload["run_id"]] = waiter
            self._requests.by_envelope[self.send(type, "USER", payload)] = waiter
        return waiter.wait(self._t(timeout), f"{type} {payload['run_id']}")

    def ping(self, timeout: float | None = None) -> float:
        """PING the server; returns the round-trip time in seconds."""
        nonce = self._up.next_id("p")
        waiter = Waiter()
        with self._wake:
            self._check()
            entry = Entry("PING", "SYSTEM", {"nonce": nonce}, f"{self._up.prefix}-{nonce}")
            self._up.pings[nonce] = (waiter, entry, 0.0)
            self._up.control.append(entry)
            self._poke()
        try:
            return waiter.wait(self._t(timeout), "PING")
        finally:
            with self._lock:
                self._up.pings.pop(nonce, None)

    # -- internals: requests ----------------------------------------------------------------

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _take(self, q: "queue.Queue[Any]", timeout: float | None, what: str) -> Any:
        try:
            item = q.get(timeout=timeout)
        except queue.Empty:
            self._check()
            raise ClientTimeout(f"no {what} within {timeout}s") from None
        if item is _ENDED:
            q.put(_ENDED)
            self._check()
            raise ConnectionLost("CLOSED", "the client was closed")
        return item

    def _check(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise ConnectionLost("CLOSED", "the client was closed")

    def _fail_all(self, error: ProtoClientError) -> None:
        """Under the lock: end every waiter with ``error`` and wake every reader."""
        self._requests.fail_all(error)
        for waiter, _, _ in self._up.pings.values():
            waiter.resolve(error=error)
        if self._hello is not None:
            self._hello.resolve(error=error)
        self.texts.put(_ENDED)
        self.inbox.put(_ENDED)
        self._poke()

    def _die(self, error: ProtoClientError) -> None:
        with self._lock:
            if self._fatal is not None or self._closed:
                return
            self._fatal = error
            conn, self._conn = self._conn, None
            self._fail_all(error)
        if conn is not None:
            conn.close()

    # -- internals: connections --------------------------------------------------------------

    def _open(self, resume: bool) -> None:
        """Open a connection whose first message is a HELLO. Under ``_send_lock``, so no
        data message gets a seq above the HELLO's before its reply says what arrived."""
        cls = TRANSPORTS[self.transport]
        with self._send_lock:
            with self._lock:
                self._check()
                hello = self._up.hello(self._hello_payload(), self.session_id or "", _now_ms())
                self._hello = Waiter()
                max_body = int((self.server_hello or {}).get("capabilities", {})
                               .get("max_message_size", 1048576))
            conn = cls(self.base, self.token,
                       session=self.session_id if resume else None,
                       last_seq=self._down.last_seq if resume else None, first=[hello.data],
                       on_frame=self._on_frame, on_close=self._on_close,
                       timeout=self.timeout, max_body=max_body)
            with self._lock:
                if self._closed or self._fatal is not None:
                    conn.close()
                    self._check()
                self._conn = conn
                if conn.session_id:
                    self.session_id = conn.session_id
                conn.start()

    def _hello_payload(self) -> dict[str, Any]:
        # Downstream credit is ours to ask for; asking means we keep granting (Downstream).
        flow = {"downstream": True, "initial_credit_messages": self.credit_messages,
                "initial_credit_bytes": self.credit_bytes} if self.downstream_credit else {}
        return {"proto_version": PROTO_VERSION, "accept_major": [1],
                "accept_events": self.accept_events,
                "capabilities": {"flow_control": flow}}

    def _on_close(self, conn: Any, code: int | None, error: BaseException | None) -> None:
        with self._lock:
            if conn is not self._conn or self._closed or self._fatal is not None:
                return
            self._conn = None
            self._ready = False
            self._up.on_connection_lost()
        if code in _FINAL_CLOSES:
            self._die(ConnectionLost(_FINAL_CLOSES[code], f"the server closed with {code}"))
        elif not self.reconnect or self.session_id is None:
            self._die(ConnectionLost("CLOSED", f"the connection ended ({error or code})"))
        else:
            threading.Thread(target=self._reconnect, name="protoflask-reconnect",
                             daemon=True).start()

    def _reconnect(self) -> None:
        window = self.reconnect_timeout
        if window is None:  # the server keeps a lost session this long
            replay = (self.server_hello or {}).get("capabilities", {}).get("replay_window", {})
            window = replay.get("time_ms", 60000) / 1000
        deadline = time.monotonic() + window
        delay = 0.02
        while not self._closed and self._fatal is None:
            try:
                self._open(resume=True)
                self.reconnects += 1
                return
            except ConnectionRefused as exc:
                if exc.status in _FINAL_STATUSES:
                    self._die(exc)
                    return
                if exc.retry_after:  # a 503 saying when (a cluster routing the session)
                    delay = max(delay, exc.retry_after)
            except Exception:  # noqa: BLE001 - unreachable for now: try again
                if self._closed or self._fatal is not None:
                    return
            if time.monotonic() + delay > deadline:
                self._die(ConnectionLost("UNREACHABLE",
                                         f"could not reconnect within {window:.0f}s"))
                return
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- internals: the writer ---------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._send_lock:
                with self._wake:
                    batch = self._take_batch()
                    conn = self._conn
                    if batch:
                        self._writing = True
                if batch is None:
                    return
                if batch:
                    self._transmit(conn, batch)
                    continue
            with self._wake:
                if not self._closed and self._fatal is None and not self._dirty:
                    idle = not self._wake.wait(0.25)
                    if idle and self._ready and self._down.unacked:
                        self._ack()  # quiet for a while: acknowledge the rest

    def _take_batch(self) -> list[Entry] | None:
        """Under both locks: the next messages to write, with their seqs; None to stop."""
        if self._closed or self._fatal is not None:
            return None
        self._dirty = False
        if not self._ready or self._conn is None:
            return []
        return self._up.take_batch(self.session_id or "", self._conn.confirms_on_send,
                                   _now_ms(), time.monotonic())

    def _transmit(self, conn: Any, batch: list[Entry]) -> None:
        try:
            conn.send([e.data for e in batch])
        except (ConnectionError, ProtoClientError) as exc:
            # The connection is (being) lost: what did not arrive is sent again after the
            # HELLO reply of the next one.
            with self._wake:
                self._writing = False
                self._poke()
            if isinstance(exc, ConnectionRefused) and exc.status in _FINAL_STATUSES:
                self._die(exc)
            else:
                conn.abort()
            return
        with self._wake:
            if conn.confirms_on_send:
                # (a resend keeps its older seq: the batch's highest, not its last)
                self._up.confirm(max(entry.seq for entry in batch))
            self._writing = False
            self._poke()



def connect(url: str = "http://127.0.0.1:8080", token: str | None = None,
            **options: Any) -> Client:
    """A connected Client (see Client for the options)."""
    return Client(url, token, **options).connect()
