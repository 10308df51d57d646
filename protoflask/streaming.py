"""Streaming a model's reply as one text: ``ProtoServer.stream_text``'s loop.

The loop knows the session only through two callables handed down by the server: ``send``
(deliver one message, False when the session is gone) and ``stop_reason`` (why the reply
must stop now, or None). It sends MESSAGE_START, the coalesced PARTs
(``core.coalesce.TextCoalescer``) and always MESSAGE_END while the session exists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .core import messages
from .core.coalesce import TextCoalescer


@dataclass(frozen=True, slots=True)
class StreamedText:
    """What ``stream_text`` sent."""

    message_id: str
    #: the text the client received (the PARTs joined)
    text: str
    parts: int
    #: None when the whole stream was sent; else why it stopped early:
    #: "run_cancelled" (or "run_finished"/"run_error": the run ended otherwise),
    #: "session_gone" (expired, closed, or no longer held by this worker)
    stopped: str | None = None

    @property
    def complete(self) -> bool:
        return self.stopped is None


def stream_chunks(chunks: Iterable[Any], message_id: str, content_type: str, *,
                  send: Callable[[messages.Outbound], bool],
                  stop_reason: Callable[[], str | None],
                  max_chars: int, max_delay_ms: int,
                  clock: Callable[[], int] | None = None) -> StreamedText:
    """Send ``chunks`` as START, PARTs, END; stop within one chunk when told to.

    Empty chunks (and None, which model SDKs yield for deltas without text) are skipped;
    anything else that is not a str raises TypeError (after END). An exception from the
    iterator closes the text (what was waiting goes out first) and propagates."""
    now = clock or _now_ms
    if not send(messages.text_start(message_id, content_type)):
        return StreamedText(message_id, "", 0, "session_gone")
    coalescer = TextCoalescer(now(), max_chars, max_delay_ms)
    sent: list[str] = []
    stopped: str | None = None

    def send_part(content: str) -> bool:
        if not send(messages.text_part(message_id, content)):
            return False
        sent.append(content)
        return True

    iterator = iter(chunks)
    try:
        for chunk in iterator:
            stopped = stop_reason()
            if stopped is not None:
                coalescer.drop()  # the reader does not want the rest
                break
            if chunk is None:
                continue
            if not isinstance(chunk, str):
                raise TypeError(f"stream_text takes text chunks, got {type(chunk).__name__}")
            for part in coalescer.push(chunk, now()):
                if not send_part(part):
                    stopped = "session_gone"
                    break
            if stopped is not None:
                break
        else:
            stopped = stop_reason()
    finally:
        if stopped is None:
            tail = coalescer.flush()
            if tail and not send_part(tail):
                stopped = "session_gone"
        if stopped != "session_gone" and not send(messages.text_end(message_id)):
            stopped = "session_gone"
        close = getattr(iterator, "close", None)
        if stopped is not None and close is not None:
            close()  # release the model's stream (a generator's finally runs now)
    return StreamedText(message_id, "".join(sent), len(sent), stopped)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
