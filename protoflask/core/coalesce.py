"""Coalescing a model's tokens into MESSAGE_PARTs (sans-I/O: the time is passed in).

A model streams one token every few milliseconds; one MESSAGE_PART per token would cost a
frame, a seq, a replay-window entry and a client wake-up per token. ``TextCoalescer``
groups tokens into parts by two budgets (docs/PROTOCOL.md §12 Application API):

- **time**: a part goes out when a chunk arrives ``max_delay_ms`` or more after the last
  part went out (or after the text started), so a slow model's tokens still go out as
  they come, and a fast model's go out at most every ``max_delay_ms``;
- **size**: a part goes out as soon as ``max_chars`` characters are waiting, and no part is
  longer than ``max_chars`` (a huge chunk is cut into several parts).

There is no timer: the budgets are checked when a chunk arrives, so a tail waits at most
until the model's next chunk or its end (``flush``).
"""

from __future__ import annotations

#: Defaults of ``ProtoServer.stream_text``: 50 ms keeps a reply fluid to a reader while a
#: fast model (hundreds of tokens a second) costs about 20 parts a second.
DEFAULT_MAX_DELAY_MS = 50
DEFAULT_MAX_CHARS = 2048


class TextCoalescer:
    """Tokens in, parts out."""

    __slots__ = ("max_chars", "max_delay_ms", "_buffer", "_size", "_last_out")

    def __init__(self, now: int, max_chars: int = DEFAULT_MAX_CHARS,
                 max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> None:
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        if max_delay_ms < 0:
            raise ValueError("max_delay_ms must not be negative")
        self.max_chars = max_chars
        self.max_delay_ms = max_delay_ms
        self._buffer: list[str] = []
        self._size = 0
        self._last_out = now

    @property
    def waiting(self) -> int:
        """Characters held back, not yet in a part."""
        return self._size

    def push(self, chunk: str, now: int) -> list[str]:
        """Take one chunk; return the parts that are due now (often none)."""
        if not chunk:
            return []
        self._buffer.append(chunk)
        self._size += len(chunk)
        parts: list[str] = []
        if self._size >= self.max_chars:
            text = "".join(self._buffer)
            cut = len(text) - len(text) % self.max_chars
            parts = [text[i:i + self.max_chars] for i in range(0, cut, self.max_chars)]
            rest = text[cut:]
            self._buffer = [rest] if rest else []
            self._size = len(rest)
        if self._size and now - self._last_out >= self.max_delay_ms:
            parts.append(self._take())
        if parts:
            self._last_out = now
        return parts

    def flush(self) -> str:
        """Everything held back (the text's last part), or ""."""
        return self._take() if self._size else ""

    def drop(self) -> int:
        """Forget what is held back (a cancelled reply); returns how many characters."""
        dropped, self._buffer, self._size = self._size, [], 0
        return dropped

    def _take(self) -> str:
        text = "".join(self._buffer)
        self._buffer, self._size = [], 0
        return text
