"""AG-UI events on the native WebSocket (docs/AGUI.md, "AG-UI events on the WebSocket"), a
protoflask extension: a client whose first HELLO asks for ``capabilities.extensions:
["agui"]`` gets every run of its session as AG-UI events, one ``AGUI_EVENT`` envelope a
frame, with the rest of the session's traffic native around them.

A session's ``SocketTranslator`` turns what the session sends, in seq order, into what its
WebSocket writes: the messages of a run (from its native RUN_STARTED to its RUN_FINISHED)
through ``mapping.RunTranslator`` (the mapping, written once, framed as envelopes); any
other message as it is. It is the session's, not a connection's: a resumed connection is
replayed what the client missed, and a seq translated before is written again exactly as
it was the first time (``memo``), made-up events included, so the native resume from
``last_seq`` gives the AG-UI events exactly once. A session that moved here from another
node of a cluster starts its translator from the oldest message of its replay window.

A client starts a run with the native ``RUN_STARTED`` whose ``metadata.agui`` is the
RunAgentInput (the application's AG-UI handler answers it, as for ``POST /proto/agui``),
and stops it with the native ``RUN_CANCEL``.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

import gevent
import orjson

from ..core.errors import ProtoError
from .input import parse_run_input
from .lost import HANDLER_NODE, LostHandlers
from .mapping import (
    CONTENT_KEY, PART_HEAD, SOCKET, SOCKET_CONTENT, RunTranslator, is_part_tail,
)
from .run import AguiServices, start_run_handler

if TYPE_CHECKING:
    from ..core.calls import Run
    from ..port import AdapterPorts, SessionState

log = logging.getLogger("protoflask.agui")

#: The extension's name in HELLO ``capabilities.extensions``.
EXTENSION = "agui"
_RUN_STARTED = b'"type":"RUN_STARTED"'
Ready = list[tuple[int, bytes]]
TRIM_EVERY = 256
_NO_TEXTS: frozenset[bytes] = frozenset()


class Held(Protocol):
    """A session as the translator reads it: its id and its protocol state."""

    @property
    def id(self) -> str: ...
    @property
    def core(self) -> "SessionState": ...


class SocketTranslator:
    """What one session's WebSocket writes (see the module doc)."""

    def __init__(self, live: Held) -> None:
        self.session_id = live.id
        self.core = live.core
        self.run: RunTranslator | None = None
        #: the highest seq translated; the frames each run's seq became, while the
        #: client may be replayed it (until its ACK or the window's bound)
        self.last = 0
        #: (trimmed by seq, never iterated: a dict emptied from the front is slow to
        #: iterate, and an OrderedDict costs twice as much to fill); a seq that became one
        #: frame keeps the (seq, frame) item written, one that became several their list
        self.memo: dict[int, tuple[int, bytes] | Ready] = {}
        self.bound = live.core.settings.replay_window_size
        self.trimmed = 0  # the last seq when the memo was trimmed
        self.floor = 0  # no seq at or below it is in the memo

    def translate_plain(self, ready: Ready) -> Ready:
        """What the socket writes for ``ready``: each message through the run's mapping
        (``_step``), a seq translated before as it was the first time (``_replay``). The
        definition ``translate_fast`` is held equal to (tests/agui/test_fastpath.py)."""
        if not ready:
            return ready
        if ready[0][0] > self.last + 1:
            self._catch_up(ready[0][0])
        out: Ready = []
        for seq, data in ready:
            if seq <= self.last:
                self._replay(seq, data, out)
            else:
                self._step(seq, data, out)
        if self.last - self.trimmed >= TRIM_EVERY:
            self._trim()
        return out

    def translate_fast(self, ready: Ready) -> Ready:
        """``translate_plain``, with a text part of the run's open text written around its
        envelope's bytes (agui/mapping.py's module doc): the per-part path, no call."""
        if not ready:
            return ready
        if ready[0][0] > self.last + 1:
            self._catch_up(ready[0][0])
        out: Ready = []
        memo, last = self.memo, self.last
        run = self.run
        texts = run.texts if run is not None else _NO_TEXTS
        for seq, data in ready:
            if seq <= last:  # a replay after a resume: what it was the first time
                self._replay(seq, data, out)
                continue
            if texts:  # the run is started and has an open text (RunTranslator.texts)
                head, found, rest = data.partition(PART_HEAD)
                if found:
                    mid, _, tail = rest.partition(CONTENT_KEY)
                    # is_part_tail's common case (no quote in the content) first
                    if mid in texts and tail and (tail[-3] == 34 and tail.count(b'"') == 2
                                                  or is_part_tail(tail)):
                        kept = memo[seq] = (seq, SOCKET_CONTENT % (head, mid, tail))
                        out.append(kept)
                        last = seq
                        continue
            self.last = last
            self._step(seq, data, out)
            last = seq
            run = self.run
            texts = run.texts if run is not None else _NO_TEXTS
        self.last = last
        if last - self.trimmed >= TRIM_EVERY:
            self._trim()
        return out

    #: The swap point: what the port calls (``SessionPort.translate`` is the translator).
    __call__ = translate_fast

    def _replay(self, seq: int, data: bytes, out: Ready) -> None:
        """A seq the client is replayed after a resume: written as the first time."""
        kept = self.memo.get(seq)
        if kept is None:  # sent as it was (or no longer kept: the window has it as it was)
            out.append((seq, data))
        elif isinstance(kept, tuple):
            out.append(kept)
        else:
            out += kept

    def _step(self, seq: int, data: bytes, out: Ready) -> None:
        """A seq not translated before: the run's frames of it (kept for a replay), or the
        message as it is."""
        frames: list[bytes] = []
        if self._feed(seq, data, frames, True):
            if len(frames) == 1:  # the common case, kept as the item written
                item = self.memo[seq] = (seq, frames[0])
                out.append(item)
            else:
                items = self.memo[seq] = [(seq, frame) for frame in frames]
                out += items
        else:
            out.append((seq, data))
        self.last = seq

    def _feed(self, seq: int, data: bytes, frames: list[bytes], write: bool) -> bool:
        run = self.run
        if run is None:
            if _RUN_STARTED not in data:
                return False
            env = orjson.loads(data)
            payload = env.get("payload") or {}
            if env.get("type") != "RUN_STARTED" or "run_id" not in payload:
                return False
            run = self.run = RunTranslator(str(payload.get("thread_id") or self.session_id),
                                           str(payload["run_id"]), framing=SOCKET)
        taken = run.feed(seq, data, frames, write)
        if run.ended:
            self.run = None
        return taken

    def _catch_up(self, first: int) -> None:
        """The translator's state as of ``first`` from what the replay window holds of the
        messages it has not read: all of them for a session that moved here from another
        node, those a stream of another kind (SSE) carried meanwhile."""
        last = self.last
        for seq, _, data in list(self.core.replay):
            if seq >= first:
                break
            if seq > last:
                self._feed(seq, data, [], False)
        self.last = first - 1
        if not self.memo:  # the memo starts here (so _trim never walks the seqs before)
            self.floor = self.trimmed = first - 1

    def _trim(self) -> None:
        """Forget what the client can no longer be replayed (looked at every TRIM_EVERY
        seqs)."""
        memo = self.memo
        self.trimmed = last = self.last
        # what the replay window no longer holds (ACKed, or evicted by its size, bytes or
        # age) is never replayed: the memo is at most the window's seqs
        first = self.core.replay.first_seq
        floor = max(self.core.last_ack, last - self.bound,
                    first - 1 if first is not None else last)
        for seq in range(self.floor + 1, floor + 1):
            memo.pop(seq, None)
        self.floor = max(self.floor, floor)


class SocketAgui:
    """The extension on one server: installs a session's translator on its WebSocket and
    starts the handler of a run a client started with a RunAgentInput."""

    def __init__(self, ports: Callable[[], "AdapterPorts"],
                 services: Callable[[], AguiServices]) -> None:
        #: the adapters' ports of the server's engine of the moment (init_app may remake it)
        self.ports = ports
        self.services = services
        #: by the session's protocol state: a translator lives as long as its session here
        self.translators: "weakref.WeakKeyDictionary[Any, SocketTranslator]" = \
            weakref.WeakKeyDictionary()
        #: runs whose handler is on another node, watched (agui/lost.py)
        self.lost = LostHandlers(ports, services)

    def on_attached(self, sender: Any, session_id: str, **_: Any) -> None:
        """The ``connect`` and ``handshake`` signals' receiver."""
        self.attach(session_id)

    def on_run_started(self, sender: Any, session_id: str, run: "Run", **_: Any) -> None:
        """The ``runStarted`` signal's receiver."""
        self.run_started(session_id, run)

    def attach(self, session_id: str) -> None:
        """A transport attached, or the session's first HELLO came: a WebSocket of a session
        that asked for the extension writes through the session's translator."""
        ports = self.ports()
        state = ports.state_here(session_id)
        if state is None or EXTENSION not in state.extensions and ports.node_id is None:
            return  # nothing to watch (alone) nor to translate: no port made (every connect)
        port = ports.here(session_id)
        if port is None:
            return
        self.lost.attached(port)
        state = ports.state(port)
        if EXTENSION not in state.extensions:
            return
        transport = ports.serving(port)
        if transport is None or transport.kind != "websocket":
            return  # the extension is the WebSocket's; SSE and HTTP streams stay native
        translator = self.translators.get(state)
        if translator is None:
            translator = self.translators[state] = SocketTranslator(_Held(port.id, state))
        transport.translate = translator

    def run_started(self, session_id: str, run: "Run") -> None:
        """A run a client started with ``metadata.agui`` (a RunAgentInput): its handler."""
        metadata = run.metadata
        if not isinstance(metadata, dict) or "agui" not in metadata:
            return
        ports = self.ports()
        port = ports.here(session_id)
        if port is None:
            return
        body = dict(metadata["agui"]) if isinstance(metadata["agui"], dict) else {}
        # the run's ids are the native message's: a RunAgentInput may leave them out
        body.setdefault("threadId", run.thread_id or session_id)
        body["runId"] = run.run_id
        try:
            run_input = parse_run_input(orjson.dumps(body))
        except ProtoError as exc:  # the run has started: it ends with RUN_ERROR
            gevent.spawn(_refuse, self.services(), session_id, run.run_id, exc)
            return
        node = ports.node_id
        if node is not None:  # the node its handler runs on (agui/lost.py)
            metadata[HANDLER_NODE] = node
            ports.note_state(port)  # the cluster's record of the session knows it
        start_run_handler(self.services(), session_id, run_input)


class _Held(NamedTuple):
    id: str
    core: "SessionState"


def _refuse(services: AguiServices, session_id: str, run_id: str, exc: ProtoError) -> None:
    """End a run whose RunAgentInput was refused (after its RUN_STARTED went out)."""
    try:
        if services.run_status(session_id, run_id) == "active":
            services.finish_run(session_id, run_id,
                                error={"code": exc.code, "message": str(exc)})
    except ProtoError:
        pass  # ended meanwhile, or the session expired
