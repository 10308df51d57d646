"""The client: one session over any transport, kept alive across dropped connections.

Threads (greenlets when gevent has monkey-patched the program):

- the transport's reader calls ``_on_frame`` for each downstream message;
- one writer sends upstream messages in seq order (control messages first, data
  messages only within the server's credit and not on a channel it paused);
- a reconnect thread, only while the connection is lost.

Exactly once, both ways (docs/PROTOCOL.md §2, §8):

- Downstream, every message has a session seq; the client remembers the last one it
  delivered, drops anything at or below it, and resumes with ``last_seq`` = that seq.
- Upstream, a data message keeps its place in ``_unconfirmed`` until the server has
  surely seen it: a 202 to the POST that carried it (SSE, stream), the PONG to a later
  PING of ours (the server handles one connection's messages in order), or a HELLO reply
  whose ``last_client_seq`` covers it. After a reconnect the client sends HELLO first;
  the reply's ``last_client_seq`` says which unconfirmed messages arrived, and the others
  are sent again with new seqs (the client writes one batch at a time, so every message
  at or below ``last_client_seq`` arrived; a seq the server has seen would be dropped as a
  retransmission).

Credits (docs/PROTOCOL.md §5 Flow control): the client asks for downstream credit in HELLO
(``flow_control.downstream: true``, unless ``downstream_credit=False``) and tops each
channel up with FLOW_UPDATE when half is spent; a re-HELLO after a resume resets the
server's view of it, so a FLOW_UPDATE lost with a connection costs nothing. Upstream, it
counts down the server's grants from the HELLO reply, adds the server's FLOW_UPDATEs,
and holds data messages while a channel has no credit or is paused.

Back-pressure: a message the server refused with CHANNEL_PAUSED is sent again after
RESUME_CHANNEL. Everything sent between the server's pause and our hearing of it is
refused too, so after a refusal the channel is sent in a window that starts at
``_CAUTIOUS_START`` messages and doubles each time the server is known to have processed
the whole window (the PONG to a PING sent after it), until it passes
``_CAUTIOUS_END``; another refusal starts it over. This keeps a client that is paused
again and again from resending its whole queue into each pause.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson

from ..core.envelope import CONTROL_TYPES
from ..core.errors import CloseCode
from ..core.messages import PROTO_VERSION
from ._http import BaseURL
from ._sse import SSEConnection
from ._stream import StreamConnection
from ._ws import WSConnection
from .errors import (
    ClientTimeout, ConnectionLost, ConnectionRefused, ProtoClientError, RunError,
    ServerError, ToolCancelled, ToolError,
)

TRANSPORTS: dict[str, type] = {
    "ws": WSConnection, "websocket": WSConnection,
    "sse": SSEConnection,
    "stream": StreamConnection, "http": StreamConnection,
}
#: The window of a channel after a CHANNEL_PAUSED refusal (see the module docstring).
_CAUTIOUS_START, _CAUTIOUS_END = 8, 1024
#: Close codes after which reconnecting would be wrong (docs/PROTOCOL.md §6.2 Close codes).
_FINAL_CLOSES = {c: c.name for c in (CloseCode.UNSUPPORTED_VERSION, CloseCode.SUPERSEDED)}
#: HTTP refusals that no retry will fix: the token or the session is gone.
_FINAL_STATUSES = {400, 401, 403, 404, 413}
#: What the client itself needs to receive, added to a non-empty ``accept_events``.
_NEEDED_EVENTS = ("PONG", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL")
_ENDED = object()
_ENVELOPE_OVERHEAD = 200  # bytes an envelope adds around its payload, generously


@dataclass
class Text:
    """A text the server streamed (MESSAGE_START / PART... / END), assembled."""

    message_id: str
    text: str
    content_type: str
    channel: str


@dataclass
class _Entry:
    """One upstream message; ``seq`` and ``data`` are set when it is written."""

    type: str
    channel: str
    payload: dict[str, Any]
    id: str
    seq: int = 0
    data: bytes = b""
    charged: bool = False


@dataclass
class _Waiter:
    """A request waiting for its answer (a HELLO, run, tool list or ping reply)."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.result, self.error = result, error
            self.done.set()

    def wait(self, timeout: float | None, what: str) -> Any:
        if not self.done.wait(timeout):
            raise ClientTimeout(f"no answer to {what} within {timeout}s")
        if self.error is not None:
            raise self.error
        return self.result


class ToolCall:
    """A tool call in progress: ``result(timeout)`` waits for its TOOL_DONE."""

    def __init__(self, client: "Client", call_id: str, tool: str,
                 on_progress: Callable[[float | None, str, Any], None] | None) -> None:
        self.client, self.call_id, self.tool = client, call_id, tool
        self.on_progress = on_progress
        self.updates: list[dict[str, Any]] = []
        self._waiter = _Waiter()

    @property
    def done(self) -> bool:
        return self._waiter.done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The tool's result; raises ToolError (with the contract code), ToolCancelled
        or ClientTimeout."""
        return self._waiter.wait(timeout, f"tool call {self.call_id} ({self.tool})")

    def cancel(self) -> None:
        """Ask the server to cancel; ``result()`` then raises ToolCancelled."""
        self.client.send("TOOL_CANCEL", "USER", {"call_id": self.call_id})


class Client:
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
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._seq = 0  # last upstream seq assigned
        self._control: deque[_Entry] = deque()
        self._data: deque[_Entry] = deque()
        self._unconfirmed: deque[_Entry] = deque()
        self._recent: OrderedDict[str, _Entry] = OrderedDict()  # id -> sent data entry
        self._conn: Any = None
        self._ready = False  # the current connection's HELLO was answered
        self._hello: _Waiter | None = None
        self._closed = False
        self._fatal: ProtoClientError | None = None
        self._writing = False
        self._dirty = False  # set with every wake-up, so the writer cannot miss one
        self._flow = True
        self._up: dict[str, list[int]] = {}  # channel -> [messages, bytes] we may send
        self._up_initial = (0, 0)
        self._paused_up: set[str] = set()
        self._retry: list[_Entry] = []  # refused with CHANNEL_PAUSED: sent again on resume
        # channel -> [window, sent since the last proof, seq of the last sent] after a
        # CHANNEL_PAUSED refusal
        self._cautious: dict[str, list[int]] = {}
        self._down: dict[str, list[int]] = {}  # channel -> [messages, bytes] granted
        self._last_seq = 0  # last downstream seq delivered
        self._acked = 0
        self._pings: dict[str, tuple[_Waiter, _Entry, float]] = {}
        self._confirm_ping: str | None = None
        self._calls: dict[str, ToolCall] = {}
        self._requests: dict[str, Any] = {}  # envelope id -> _Waiter / ToolCall
        self._runs_started: dict[str, _Waiter] = {}
        self._runs_ended: dict[str, _Waiter] = {}
        self._tool_lists: deque[_Waiter] = deque()
        self._open_texts: dict[str, tuple[str, str, list[str]]] = {}
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
            while self._control or self._data or self._writing:
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
        return self._last_seq

    # -- sending --------------------------------------------------------------------------

    def send(self, type: str, channel: str = "USER",
             payload: dict[str, Any] | None = None) -> str:
        """Queue any message; returns its envelope id (an ERROR about it names it as
        ``related_id``). Data messages wait for credit; this waits only while more than
        1000 of them are queued."""
        entry = _Entry(type, channel, dict(payload or {}), f"{self._prefix}-{next(self._ids)}")
        limit = (self.server_hello or {}).get("capabilities", {}).get("max_message_size")
        if limit and len(orjson.dumps(entry.payload)) + _ENVELOPE_OVERHEAD > limit:
            raise ProtoClientError("MESSAGE_TOO_LARGE",
                                   f"a {type} this large exceeds the server's {limit} bytes")
        with self._wake:
            self._check()
            if type in CONTROL_TYPES:
                self._control.append(entry)
            else:
                while len(self._data) >= 1000:
                    self._wake.wait(0.1)
                    self._check()
                self._data.append(entry)
            self._poke()
        return entry.id

    def send_text(self, text: str | Iterable[str], content_type: str = "text/plain",
                  message_id: str | None = None) -> str:
        """A whole text (a string, or an iterable of parts streamed as they come):
        MESSAGE_START, a MESSAGE_PART per part, MESSAGE_END. Returns the message_id."""
        mid = message_id or f"{self._prefix}-m{next(self._ids)}"
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
                        on_progress: Callable[[float | None, str, Any], None] | None = None,
                        run_id: str | None = None, call_id: str | None = None) -> ToolCall:
        """Start a tool call; ``on_progress(progress, status, partial)`` is called for each
        TOOL_UPDATE (from the reader thread: keep it short)."""
        call_id = call_id or f"{self._prefix}-call{next(self._ids)}"
        call = ToolCall(self, call_id, tool, on_progress)
        payload: dict[str, Any] = {"call_id": call_id, "tool": tool, "params": params or {}}
        if run_id is not None:
            payload["run_id"] = run_id
        with self._lock:
            self._calls[call_id] = call
            self._requests[self._send_entry("TOOL_CALL", "USER", payload)] = call
        return call

    def call_tool(self, tool: str, params: dict[str, Any] | None = None, *,
                  on_progress: Callable[[float | None, str, Any], None] | None = None,
                  run_id: str | None = None, timeout: float | None = None) -> Any:
        """Call a tool and return its result; raises ToolError with the contract code
        (``TOOL_NOT_FOUND``, ``INVALID_MESSAGE``, ``TOOL_EXECUTION_ERROR``...)."""
        return self.call_tool_async(tool, params, on_progress=on_progress,
                                    run_id=run_id).result(timeout)

    def list_tools(self, timeout: float | None = None) -> list[dict[str, Any]]:
        waiter = _Waiter()
        with self._lock:
            self._tool_lists.append(waiter)
            self._requests[self._send_entry("TOOL_LIST", "SYSTEM", {})] = waiter
        return waiter.wait(self._t(timeout), "TOOL_LIST")

    def start_run(self, run_id: str | None = None, *, thread_id: str | None = None,
                  metadata: Any = None, timeout: float | None = None) -> str:
        """RUN_STARTED; returns the run_id (generated here when not given)."""
        run_id = run_id or f"{self._prefix}-run{next(self._ids)}"
        payload: dict[str, Any] = {"run_id": run_id}
        if thread_id is not None:
            payload["thread_id"] = thread_id
        if metadata is not None:
            payload["metadata"] = metadata
        waiter = _Waiter()
        with self._lock:
            self._runs_started[run_id] = waiter
            self._requests[self._send_entry("RUN_STARTED", "USER", payload)] = waiter
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
        waiter = _Waiter()
        with self._lock:
            self._runs_ended[payload["run_id"]] = waiter
            self._requests[self._send_entry(type, "USER", payload)] = waiter
        return waiter.wait(self._t(timeout), f"{type} {payload['run_id']}")

    def ping(self, timeout: float | None = None) -> float:
        """PING the server; returns the round-trip time in seconds."""
        nonce = f"{self._prefix}-p{next(self._ids)}"
        waiter = _Waiter()
        with self._wake:
            self._check()
            entry = _Entry("PING", "SYSTEM", {"nonce": nonce}, f"{self._prefix}-{nonce}")
            self._pings[nonce] = (waiter, entry, 0.0)
            self._control.append(entry)
            self._poke()
        try:
            return waiter.wait(self._t(timeout), "PING")
        finally:
            with self._lock:
                self._pings.pop(nonce, None)

    # -- internals: requests ----------------------------------------------------------------

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _send_entry(self, type: str, channel: str, payload: dict[str, Any]) -> str:
        return self.send(type, channel, payload)

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
        for call in self._calls.values():
            call._waiter.resolve(error=error)
        for waiter in [*self._runs_started.values(), *self._runs_ended.values(),
                       *self._tool_lists, *(p[0] for p in self._pings.values())]:
            waiter.resolve(error=error)
        if self._hello is not None:
            self._hello.resolve(error=error)
        self._calls.clear()
        self._requests.clear()
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
                self._seq += 1
                hello = _Entry("HELLO", "SYSTEM", self._hello_payload(),
                               f"{self._prefix}-hello{self._seq}", seq=self._seq)
                hello.data = self._encode(hello)
                self._hello = _Waiter()
                max_body = int((self.server_hello or {}).get("capabilities", {})
                               .get("max_message_size", 1048576))
            conn = cls(self.base, self.token,
                       session=self.session_id if resume else None,
                       last_seq=self._last_seq if resume else None, first=[hello.data],
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
        # Downstream credit is ours to ask for; asking means we keep granting (_spend_down).
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
            # PONGs, ACKs and FLOW_UPDATEs for the old connection are stale; our PINGs
            # are asked again on the next one.
            if self._confirm_ping is not None:
                del self._pings[self._confirm_ping]
                self._confirm_ping = None
            self._control = deque(entry for _, entry, _ in self._pings.values())
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
                    if idle and self._ready and self._last_seq > self._acked:
                        self._ack()  # quiet for a while: acknowledge the rest

    def _take_batch(self) -> list[_Entry] | None:
        """Under both locks: the next messages to write, with their seqs; None to stop.
        Control messages first; data messages while their channel has credit."""
        if self._closed or self._fatal is not None:
            return None
        self._dirty = False
        if not self._ready or self._conn is None:
            return []
        batch: list[_Entry] = []
        seq = self._seq
        while self._control:
            entry = self._control.popleft()
            seq += 1
            entry.seq, entry.data = seq, b""
            batch.append(entry)
            if entry.type == "PING" and entry.payload["nonce"] in self._pings:
                waiter = self._pings[entry.payload["nonce"]][0]
                self._pings[entry.payload["nonce"]] = (waiter, entry, time.monotonic())
        while self._data and len(batch) < 256:
            entry = self._data[0]
            if entry.channel in self._paused_up:
                break
            window = self._cautious.get(entry.channel)
            if window is not None and window[1] >= window[0]:
                break  # wait until the server has surely processed the window
            entry.seq = seq + 1
            entry.data = self._encode(entry)
            if self._flow:
                credit = self._up.setdefault(entry.channel, list(self._up_initial))
                if credit[0] < 1 or credit[1] < len(entry.data):
                    break
                credit[0] -= 1
                credit[1] -= len(entry.data)
                entry.charged = True
            seq += 1
            if window is not None:
                window[1] += 1
                window[2] = seq
            self._data.popleft()
            batch.append(entry)
            self._unconfirmed.append(entry)
            self._recent[entry.id] = entry
            if len(self._recent) > 1024:
                self._recent.popitem(last=False)
        if self._confirm_ping is None and (
                (not self._conn.confirms_on_send and len(self._unconfirmed) >= 64)
                or any(w[1] >= w[0] for w in self._cautious.values())):
            # Ask for a PONG: it proves every message before it arrived (same connection).
            nonce = self._confirm_ping = f"{self._prefix}-confirm{next(self._ids)}"
            seq += 1
            entry = _Entry("PING", "SYSTEM", {"nonce": nonce}, nonce, seq=seq)
            self._pings[nonce] = (_Waiter(), entry, time.monotonic())
            batch.append(entry)
        for entry in batch:
            if not entry.data:
                entry.data = self._encode(entry)
        self._seq = seq
        return batch

    def _transmit(self, conn: Any, batch: list[_Entry]) -> None:
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
                self._confirm(batch[-1].seq)
            self._writing = False
            self._poke()

    def _poke(self) -> None:
        """Under the lock: something changed that the writer (or flush) must look at."""
        self._dirty = True
        self._wake.notify_all()

    def _confirm(self, seq: int) -> None:
        while self._unconfirmed and self._unconfirmed[0].seq <= seq:
            self._unconfirmed.popleft()

    def _proved(self, seq: int) -> None:
        """Under the lock: a PONG says the server processed everything up to ``seq``, and
        any refusal of those came before it (a 202 does not: the ERRORs of a body come on
        the downstream, after it)."""
        for channel, window in list(self._cautious.items()):
            if window[1] and window[2] <= seq:  # the whole window went through
                if window[0] * 2 > _CAUTIOUS_END:
                    del self._cautious[channel]
                else:
                    window[0], window[1] = window[0] * 2, 0
                self._poke()

    def _ack(self) -> None:
        self._acked = self._last_seq
        self._control.append(_Entry("ACK", "SYSTEM", {"seq": str(self._last_seq)},
                                    f"{self._prefix}-{next(self._ids)}"))
        self._poke()

    def _encode(self, entry: _Entry) -> bytes:
        return orjson.dumps({"id": entry.id, "session": self.session_id or "",
                             "seq": str(entry.seq), "ts": str(int(time.time() * 1000)),
                             "type": entry.type, "channel": entry.channel,
                             "payload": entry.payload})

    # -- internals: the reader ----------------------------------------------------------------

    def _on_frame(self, conn: Any, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
            seq = int(msg["seq"])
            mtype, channel, payload = msg["type"], msg["channel"], msg["payload"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return  # not an envelope: nothing a client can do with it
        with self._wake:
            if conn is not self._conn or seq <= self._last_seq:
                return  # a stale connection, or already delivered before a resume
            self._last_seq = seq
            if mtype not in CONTROL_TYPES and self.downstream_credit:
                self._spend_down(channel, len(data))
            if seq - self._acked >= 32:
                self._ack()
            consumed = self._dispatch(mtype, payload, msg)
        if self.on_message is not None:
            self.on_message(msg)
        if not consumed:
            self.inbox.put(msg)

    def _spend_down(self, channel: str, nbytes: int) -> None:
        left = self._down.setdefault(channel, [self.credit_messages, self.credit_bytes])
        left[0] -= 1
        left[1] -= nbytes
        if left[0] <= self.credit_messages // 2 or left[1] <= self.credit_bytes // 2:
            self._control.append(_Entry(
                "FLOW_UPDATE", "SYSTEM",
                {"channel": channel, "add_messages": self.credit_messages - left[0],
                 "add_bytes": self.credit_bytes - left[1]},
                f"{self._prefix}-{next(self._ids)}"))
            left[0], left[1] = self.credit_messages, self.credit_bytes
            self._poke()

    def _dispatch(self, mtype: str, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        """Under the lock: hand a message to whoever waits for it. False: nobody did."""
        handler = _HANDLERS.get(mtype)
        return handler(self, p, msg) if handler is not None else False

    def _on_hello(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        first = self.server_hello is None
        if first:
            self.server_hello = p
            self.session_id = p.get("session") or self.session_id
            fc = p.get("capabilities", {}).get("flow_control", {})
            self._flow = bool(fc.get("enabled", True))
            self._up_initial = (int(fc.get("initial_credit_messages", 1000)),
                                int(fc.get("initial_credit_bytes", 1048576)))
        last_client_seq = int(p.get("last_client_seq", 0))
        # What the server saw is confirmed; the rest goes out again, first, in order.
        resend = [e for e in self._unconfirmed if e.seq > last_client_seq]
        self._unconfirmed.clear()
        for entry in reversed(resend):
            self._refund(entry)
            self._data.appendleft(entry)
        self._down.clear()  # the HELLO's announcement restarts the server's count
        for window in self._cautious.values():
            window[1] = 0  # what it counted is resent (or was confirmed) above
        self._ready = True
        self._poke()
        if self._hello is not None:
            self._hello.resolve(p)
        return True

    def _refund(self, entry: _Entry) -> None:
        if entry.charged:
            credit = self._up.setdefault(entry.channel, list(self._up_initial))
            credit[0] += 1
            credit[1] += len(entry.data)
            entry.charged = False

    def _on_ping(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        self._control.append(_Entry("PONG", "SYSTEM", {"nonce": p.get("nonce", "")},
                                    f"{self._prefix}-{next(self._ids)}"))
        self._poke()
        return True

    def _on_pong(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        nonce = p.get("nonce")
        ping = self._pings.get(nonce) if isinstance(nonce, str) else None
        if ping is None:
            return False
        waiter, entry, sent_at = ping
        self._confirm(entry.seq - 1)
        self._proved(entry.seq - 1)
        if nonce == self._confirm_ping:
            self._confirm_ping = None
            del self._pings[nonce]
        waiter.resolve(time.monotonic() - sent_at)
        return True

    def _on_flow_update(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        credit = self._up.setdefault(p.get("channel", ""), list(self._up_initial))
        credit[0] += int(p.get("add_messages") or 0)
        credit[1] += int(p.get("add_bytes") or 0)
        self._poke()
        return True

    def _on_pause(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        channel = p.get("channel", "")
        if msg["type"] == "PAUSE_CHANNEL":
            self._paused_up.add(channel)
        else:
            self._paused_up.discard(channel)
            retry = [e for e in self._retry if e.channel == channel]
            self._retry = [e for e in self._retry if e.channel != channel]
            self._data.extendleft(reversed(retry))  # first, in their original order
            self._poke()
        return True

    def _on_text(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        mid, mtype = p.get("message_id", ""), msg["type"]
        if mtype == "MESSAGE_START":
            self._open_texts[mid] = (p.get("content_type", "text/plain"), msg["channel"], [])
        elif mid in self._open_texts:
            content_type, channel, parts = self._open_texts[mid]
            if mtype == "MESSAGE_PART":
                content = p.get("content", "")
                parts.append(content)
                if self.on_text_part is not None:
                    self.on_text_part(mid, content)
            else:
                del self._open_texts[mid]
                self.texts.put(Text(mid, "".join(parts), content_type, channel))
        else:
            return False
        return True

    def _on_tool_update(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        call = self._calls.get(p.get("call_id", ""))
        if call is None:
            return False
        call.updates.append(p)
        if call.on_progress is not None:
            call.on_progress(p.get("progress"), p.get("status", ""), p.get("partial"))
        return True

    def _on_tool_done(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        call = self._calls.pop(p.get("call_id", ""), None)
        if call is None:
            return False
        status = p.get("status")
        if status == "OK":
            call._waiter.resolve(p.get("result"))
        elif status == "CANCELLED":
            call._waiter.resolve(error=ToolCancelled(call.call_id))
        else:
            err = p.get("error") or {}
            call._waiter.resolve(error=ToolError(
                err.get("code", "TOOL_EXECUTION_ERROR"), err.get("message", ""),
                err.get("detail"), call_id=call.call_id))
        return True

    def _on_tool_list(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        if not self._tool_lists:
            return False
        self._tool_lists.popleft().resolve(p.get("tools", []))
        return True

    def _on_run_started(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        waiter = self._runs_started.pop(p.get("run_id", ""), None)
        if waiter is None:
            return False
        waiter.resolve(p)
        return True

    def _on_run_finished(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        waiter = self._runs_ended.pop(p.get("run_id", ""), None)
        if waiter is None:
            return False
        if p.get("status") == "error":
            err = p.get("error") or {}
            code = err.get("code", "RUN_ERROR") if isinstance(err, dict) else "RUN_ERROR"
            waiter.resolve(error=RunError(code, str(err), p))
        else:
            waiter.resolve(p)
        return True

    def _on_error(self, p: dict[str, Any], msg: dict[str, Any]) -> bool:
        code, text = p.get("code", "ERROR"), p.get("message", "")
        related = p.get("related_id")
        if code in ("CHANNEL_PAUSED", "INSUFFICIENT_CREDITS") and related in self._recent:
            # refused unprocessed, and the server charged nothing for it: neither do we
            self._refund(self._recent[related])
        if code == "CHANNEL_PAUSED" and related in self._recent:
            # Not processed: send it again once the channel is resumed.
            entry = self._recent.pop(related)
            if entry in self._unconfirmed:
                self._unconfirmed.remove(entry)
            self._retry.append(entry)
            self._paused_up.add(entry.channel)
            self._cautious[entry.channel] = [_CAUTIOUS_START, 0, 0]
            return True
        target = self._requests.pop(related, None) if related else None
        if isinstance(target, ToolCall):
            if not target.done:  # refused before it ran (DUPLICATE_CALL_ID, credits...)
                self._calls.pop(target.call_id, None)
                target._waiter.resolve(error=ToolError(code, text, p.get("detail"),
                                                       call_id=target.call_id))
            return True  # the ERROR that follows a TOOL_DONE ERROR says nothing new
        if isinstance(target, _Waiter) and not target.done.is_set():
            for table in (self._runs_started, self._runs_ended):
                for key, waiter in list(table.items()):
                    if waiter is target:
                        del table[key]
            if target in self._tool_lists:
                self._tool_lists.remove(target)
            target.resolve(error=ServerError(code, text, p.get("detail")))
            return True
        return False


_HANDLERS: dict[str, Callable[[Client, dict[str, Any], dict[str, Any]], bool]] = {
    "HELLO": Client._on_hello,
    "PING": Client._on_ping,
    "PONG": Client._on_pong,
    "FLOW_UPDATE": Client._on_flow_update,
    "PAUSE_CHANNEL": Client._on_pause,
    "RESUME_CHANNEL": Client._on_pause,
    "MESSAGE_START": Client._on_text,
    "MESSAGE_PART": Client._on_text,
    "MESSAGE_END": Client._on_text,
    "TOOL_UPDATE": Client._on_tool_update,
    "TOOL_DONE": Client._on_tool_done,
    "TOOL_LIST": Client._on_tool_list,
    "RUN_STARTED": Client._on_run_started,
    "RUN_FINISHED": Client._on_run_finished,
    "ERROR": Client._on_error,
}


def connect(url: str = "http://127.0.0.1:8080", token: str | None = None,
            **options: Any) -> Client:
    """A connected Client (see Client for the options)."""
    return Client(url, token, **options).connect()
