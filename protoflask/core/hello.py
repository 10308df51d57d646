"""The handshake's terms (docs/PROTOCOL.md §3): what a client's HELLO asks for, read into
plain values, and what the server's HELLO announces. The session applies them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .envelope import SERVER_TYPES
from .messages import SUPPORTED_MAJORS
from .settings import SessionSettings

#: the only types a client may send before its handshake
PRE_HANDSHAKE_TYPES = frozenset({"HELLO", "PING"})
#: Protocol extensions a client may ask for in its first HELLO
#: (``capabilities.extensions``, docs/PROTOCOL.md §3): "agui", AG-UI events on the socket.
EXTENSIONS = frozenset({"agui"})
_ALWAYS_ACCEPTED = frozenset({"HELLO", "ERROR", "PING"})
_MAJORS = frozenset(SUPPORTED_MAJORS)


def version_refused(payload: dict[str, Any]) -> str | None:
    """Why the HELLO's accept_major is refused, or None when a major is shared."""
    if not _MAJORS.isdisjoint(payload["accept_major"]):  # (no set made of the list)
        return None
    return (f"server speaks major {list(SUPPORTED_MAJORS)},"
            f" client accepts {payload['accept_major'][:8]}")


def accepted_events(payload: dict[str, Any]) -> frozenset[str] | None:
    """The server types the client filters to (None: all of them)."""
    asked = payload["accept_events"]
    if not asked:  # the usual HELLO: all of them (no sets made)
        return None
    wanted = frozenset(asked) & SERVER_TYPES
    return wanted | _ALWAYS_ACCEPTED if wanted else None


def client_flow_control(payload: dict[str, Any]) -> tuple[int | None, int | None, bool]:
    """The client's announced (initial_credit_messages, initial_credit_bytes, whether it
    asks for downstream credit). Downstream credit only for a client that asks for it
    (docs/PROTOCOL.md §5.2): one that merely announces the numbers is never stalled."""
    caps = payload["capabilities"]
    fc = caps.get("flow_control") if isinstance(caps, dict) else None
    if not isinstance(fc, dict):
        fc = {}
    return (_positive_int(fc.get("initial_credit_messages")),
            _positive_int(fc.get("initial_credit_bytes")), fc.get("downstream") is True)


def asked_extensions(payload: dict[str, Any]) -> frozenset[str] | None:
    """The known extensions the HELLO asks for (None: it names none)."""
    caps = payload["capabilities"]
    asked = caps.get("extensions") if isinstance(caps, dict) else None
    if not isinstance(asked, list):
        return None
    return EXTENSIONS.intersection(e for e in asked[:16] if isinstance(e, str))


def capabilities(s: SessionSettings, extensions: frozenset[str]) -> dict[str, Any]:
    """``capabilities_plain``, made once per settings and extensions (every HELLO reply of
    a server announces the same: issue 29). Shared by every reply: never changed, as no
    message's payload is once built (messages.Outbound).

    The last pair asked for is answered by identity (a worker's sessions share one
    settings object and, without extensions, one empty set): no hash of the settings,
    a dataclass's of every field, nested ones too, for every HELLO."""
    last = _last
    if s is last[0] and extensions is last[1]:
        return last[2]  # type: ignore[no-any-return]
    caps = _made(s, extensions)
    _last[:] = [s, extensions, caps]
    return caps


@lru_cache(maxsize=64)
def _made(s: SessionSettings, extensions: frozenset[str]) -> dict[str, Any]:
    return capabilities_plain(s, extensions)


#: the last settings and extensions ``capabilities`` was asked for, and their answer
#: (held here: an id is not reused while they live)
_last: list[Any] = [None, None, None]


def capabilities_plain(s: SessionSettings, extensions: frozenset[str]) -> dict[str, Any]:
    """What the server's HELLO announces of the session's settings (and the extensions
    in use, only to a client that asked)."""
    caps: dict[str, Any] = {
        "flow_control": {
            "enabled": s.credits.enabled,
            "initial_credit_messages": s.credits.initial_credit_messages,
            "initial_credit_bytes": s.credits.initial_credit_bytes,
        },
        "max_concurrent_runs": s.max_concurrent_runs,
        "replay_window": {"size": s.replay_window_size, "time_ms": s.replay_window_time},
        "heartbeat_interval_ms": s.heartbeat_interval,
        "max_message_size": s.max_message_size,
        # so a client can pace itself instead of learning the limit from RATE_LIMITED
        "rate_limit": {"messages_per_second": s.rate_limit, "burst": s.rate_limit_burst}
        if s.rate_limit else None,
        "max_json_depth": s.max_json_depth,
        "connect_ticket": True,  # POST /proto/ticket, then ?ticket= (docs/PROTOCOL.md)
    }
    if extensions:
        caps["extensions"] = sorted(extensions)
    return caps


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value
