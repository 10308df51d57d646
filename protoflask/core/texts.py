"""Texts: a client's (MESSAGE_START, PARTs, END) assembled while they are open, and the
server's split into the messages that carry it.

``OpenTexts`` holds each open text's parts and enforces maxOpenTexts, maxTextSize
(UTF-8 bytes, the protocol's measure) and the session's memory budget (``meter.py``: a
part costs what its str costs in memory). The session composes one and turns what it
returns into events.
"""

from __future__ import annotations

from dataclasses import dataclass
from sys import getsizeof

from .envelope import byte_length
from .errors import InvalidMessage, MessageTooLarge
from .messages import Outbound, split_text, text_end, text_part, text_start
from .meter import Meter, OverBudget
from .settings import SessionSettings


@dataclass(slots=True)
class Text:
    """A text being received: its START came, its END not yet."""

    content_type: str
    parts: list[str]
    size: int = 0  # UTF-8 bytes, against maxTextSize (the protocol's measure)
    memory: int = 0  # what the parts cost in memory (a str of one non-Latin-1 character
    # is 2 or 4 bytes a character): the session's byte budget counts this


class OpenTexts(dict[str, Text]):
    """message_id -> its open ``Text`` (a dict, so that the session's ``texts`` reads as
    one), with the three steps of a text and the restore of a moved session's."""

    __slots__ = ("settings", "meter")

    def __init__(self, settings: SessionSettings, meter: Meter) -> None:
        super().__init__()
        self.settings = settings
        self.meter = meter

    def start(self, mid: str, content_type: str) -> None:
        if mid in self:
            raise InvalidMessage(f"message_id {mid!r} is already open")
        limit = self.settings.max_open_texts
        if len(self) >= limit:
            raise InvalidMessage(f"too many open texts: {len(self)} are started and "
                                 f"not ended (maxOpenTexts {limit})")
        self[mid] = Text(content_type, [])

    def add(self, mid: str, content: str) -> None:
        """One MESSAGE_PART; over maxTextSize or the budget the text is discarded."""
        text = self._open(mid)
        text.size += len(content) if content.isascii() else byte_length(content)
        limit = self.settings.max_text_size
        if text.size > limit:
            self.drop(mid)
            raise MessageTooLarge(f"text {mid!r} exceeds maxTextSize ({limit} bytes); it "
                                  "was discarded")
        cost = getsizeof(content)
        try:
            self.meter.charge(cost)
        except OverBudget as exc:
            self.drop(mid)
            raise MessageTooLarge(f"text {mid!r} was discarded: {exc}") from None
        text.parts.append(content)
        text.memory += cost

    def end(self, mid: str) -> tuple[str, str]:
        """MESSAGE_END: the assembled text and its content type."""
        text = self._open(mid)
        self.drop(mid)
        return "".join(text.parts), text.content_type

    def drop(self, mid: str) -> None:
        """An open text ends (assembled or discarded): its parts' bytes are given back."""
        self.meter.release(self.pop(mid).memory)

    def restore(self, mid: str, content_type: str, so_far: str, size: int) -> None:
        """A text open on the node a session moved from, charged to this meter as each
        part was there (its user's account takes it over when the session is bound)."""
        memory = getsizeof(so_far) if so_far else 0
        self[mid] = Text(content_type, [so_far] if so_far else [], size, memory)
        self.meter.charge(memory)

    def _open(self, mid: str) -> Text:
        text = self.get(mid)
        if text is None:
            raise InvalidMessage(f"unknown message_id {mid!r}")
        return text


def outgoing_text(mid: str, text: str, content_type: str, settings: SessionSettings,
                  session_id: str) -> list[Outbound]:
    """START, PARTs, END for a text the server sends: as many PARTs as it takes for no
    envelope to exceed maxMessageSize."""
    # what the stamped envelope adds around the payload: id and session hold the
    # session id, seq and ts at most 16 and 20 digits
    room = settings.max_message_size - (128 + 2 * len(session_id))
    return [text_start(mid, content_type),
            *(text_part(mid, piece) for piece in split_text(mid, text, room)), text_end(mid)]
