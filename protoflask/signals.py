"""Every event (docs/PROTOCOL.md §12 Events) as a blinker signal in one private namespace.

Receivers get ``(sender, **kwargs)`` where sender is the ProtoServer and kwargs are the
spec's argument names in snake_case. ``ProtoServer.on("textMessage", fn)`` connects
``fn`` with the spec's positional arguments instead.
"""

from __future__ import annotations

import logging
from typing import Any

from blinker import Namespace, NamedSignal

log = logging.getLogger("protoflask")

_signals = Namespace()

started = _signals.signal("started")
stopped = _signals.signal("stopped")
connect = _signals.signal("connect")  # session_id
disconnect = _signals.signal("disconnect")  # session_id
handshake = _signals.signal("handshake")  # session_id, payload
text_message = _signals.signal("textMessage")  # session_id, message
audio_chunk = _signals.signal("audioChunk")  # session_id, message, data
binary = _signals.signal("binary")  # session_id, data
run_started = _signals.signal("runStarted")  # session_id, run
run_finished = _signals.signal("runFinished")  # session_id, run
run_cancelled = _signals.signal("runCancelled")  # session_id, run
tool_call = _signals.signal("toolCall")  # session_id, execution
error = _signals.signal("error")  # error, session_id

#: spec event name -> (signal, the kwargs passed positionally by ``server.on``)
BY_EVENT_NAME = {
    "started": (started, ()),
    "stopped": (stopped, ()),
    "connect": (connect, ("session_id",)),
    "disconnect": (disconnect, ("session_id",)),
    "handshake": (handshake, ("session_id", "payload")),
    "textMessage": (text_message, ("session_id", "message")),
    "audioChunk": (audio_chunk, ("session_id", "message")),  # the bytes: the signal's data
    "binary": (binary, ("session_id", "data")),
    "runStarted": (run_started, ("session_id", "run")),
    "runFinished": (run_finished, ("session_id", "run")),
    "runCancelled": (run_cancelled, ("session_id", "run")),
    "toolCall": (tool_call, ("session_id", "execution")),
    "error": (error, ("error",)),
}


def emit(sender: Any, signal: NamedSignal, **kwargs: Any) -> None:
    """Send ``signal`` from ``sender`` (the ProtoServer, opaque here); a receiver that
    raises goes to ``error`` and the log. The session layer is handed this bound to its
    server (``functools.partial``): it calls down to here, never into the server."""
    if not signal.receivers:
        return
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **kwargs)
        except Exception as exc:
            log.exception("a %r listener raised", signal.name)
            if signal is not error:
                emit_error(sender, exc)


def emit_error(sender: Any, exc: BaseException, **kwargs: Any) -> None:
    """The ``error`` signal for ``exc`` (``session_id`` None unless given)."""
    kwargs.setdefault("session_id", None)
    emit(sender, error, error=exc, **kwargs)
