"""Every event (docs/PROTOCOL.md §12 Events) as a blinker signal in one private namespace.

Receivers get ``(sender, **kwargs)`` where sender is the ProtoServer and kwargs are the
spec's argument names in snake_case. ``ProtoServer.on("textMessage", fn)`` connects
``fn`` with the spec's positional arguments instead.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from blinker import Namespace, NamedSignal
from blinker._utilities import make_id
from blinker.base import ANY_ID

from .pins import check_blinker

check_blinker()  # _receivers_of reads blinker's internals: fail here if they moved

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


#: The swap point of ``emit``'s walk of the receivers: blinker's ``receivers_for`` done
#: in ``emit``'s own loop (the same ids, in the same order, each looked up just before
#: its call, a dead weak one disconnected as blinker does; the sender's id made once per
#: sender object), or with False blinker's generator itself.
#: tests/test_signals_emit.py holds the calls equal; pins.check_blinker the internals.
RECEIVERS_INLINE = True
#: the last sender (weakly) and its blinker id: every emit of a server has the same one
_last_sender: list[Any] = [None, None]


def emit(sender: Any, signal: NamedSignal, **kwargs: Any) -> None:
    """Send ``signal`` from ``sender`` (the ProtoServer, opaque here); a receiver that
    raises goes to ``error`` and the log. The session layer is handed this bound to its
    server (``functools.partial``): it calls down to here, never into the server."""
    if not signal.receivers:
        return
    if not RECEIVERS_INLINE:
        for each in signal.receivers_for(sender):
            _call(each, sender, signal, kwargs)
        return
    # blinker's receivers_for (1.9), its steps here: no generator, the sender's id kept
    by_sender = signal._by_sender
    sender_id = _sender_id(sender)
    if sender_id in by_sender:
        ids = by_sender[ANY_ID] | by_sender[sender_id]
    else:
        ids = by_sender[ANY_ID].copy()
    for receiver_id in ids:
        receiver: Any = signal.receivers.get(receiver_id)  # (after the calls before it)
        if receiver is None:
            continue
        if isinstance(receiver, weakref.ref):
            receiver = receiver()
            if receiver is None:
                signal._disconnect(receiver_id, ANY_ID)
                continue
        _call(receiver, sender, signal, kwargs)


def _call(receiver: Any, sender: Any, signal: NamedSignal, kwargs: dict[str, Any]) -> None:
    try:
        receiver(sender, **kwargs)
    except Exception as exc:
        log.exception("a %r listener raised", signal.name)
        if signal is not error:
            emit_error(sender, exc)


def _sender_id(sender: Any) -> Any:
    """blinker's ``make_id(sender)``, remembered for the last sender object (weakly)."""
    last = _last_sender[0]
    if last is not None and last() is sender:
        return _last_sender[1]
    sender_id = make_id(sender)
    try:
        _last_sender[:] = [weakref.ref(sender), sender_id]
    except TypeError:  # not weakly referable: not remembered
        pass
    return sender_id


def emit_error(sender: Any, exc: BaseException, **kwargs: Any) -> None:
    """The ``error`` signal for ``exc`` (``session_id`` None unless given)."""
    kwargs.setdefault("session_id", None)
    emit(sender, error, error=exc, **kwargs)
