"""Helpers for driving a ProtocolSession with plain data (no sockets, no clock)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from protoflask.config import ServerConfig
from protoflask.core.credits import CreditSettings
from protoflask.core.envelope import CONTROL_TYPES
from protoflask.core.events import Event
from protoflask.core.session import ProtocolSession
from protoflask.core.settings import SessionSettings

SESSION_ID = "sess-1"


#: the configuration's defaults, as the server builds them (config.py declares them once)
DEFAULT_SETTINGS = ServerConfig().session_settings()


def session_settings(**overrides: Any) -> SessionSettings:
    """The default session settings with ``overrides``."""
    return replace(DEFAULT_SETTINGS, **overrides)


def credit_settings(**overrides: Any) -> CreditSettings:
    """The default credit settings with ``overrides``."""
    return replace(DEFAULT_SETTINGS.credits, **overrides)


def receive_events(s: ProtocolSession, raw: bytes | str, now: int) -> list[Event]:
    """``receive``, then the events waiting (all of them: the one way out)."""
    s.receive(raw, now)
    return s.take_events()


def receive_decoded_events(s: ProtocolSession, obj: Any, nbytes: int, now: int) -> list[Event]:
    s.receive_decoded(obj, nbytes, now)
    return s.take_events()


def tick_events(s: ProtocolSession, now: int) -> list[Event]:
    s.tick(now)
    return s.take_events()


def make_session(now: int = 0, attach: bool = True, credits: dict[str, Any] | None = None,
                 greeted: bool = False, **overrides: Any) -> ProtocolSession:
    settings = session_settings(**overrides)
    if credits:
        settings = replace(settings, credits=credit_settings(**credits))
    s = ProtocolSession(SESSION_ID, "user-1", settings, now, greeted=greeted)
    if attach:
        s.attach(now)
    return s


def default_channel(mtype: str) -> str:
    if mtype in CONTROL_TYPES or mtype == "TOOL_LIST":
        return "SYSTEM"
    if mtype == "AUDIO_CHUNK":
        return "AUDIO_IN"
    return "USER"


def envelope(mtype: str, payload: Any, *, seq: Any = "1", channel: str | None = None,
             id: Any = "c-1", session: str = SESSION_ID, ts: Any = "1700000000000",
             **extra: Any) -> dict[str, Any]:
    env = {"id": id, "session": session, "seq": seq, "ts": ts, "type": mtype,
           "channel": default_channel(mtype) if channel is None else channel, "payload": payload}
    env.update(extra)
    return env


def raw(mtype: str, payload: Any, **kw: Any) -> bytes:
    return json.dumps(envelope(mtype, payload, **kw), ensure_ascii=False).encode()


def hello_payload(**overrides: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"proto_version": "1.1.2", "accept_major": [1], "accept_events": []}
    p.update(overrides)
    return p


class Client:
    """Plays the client side: numbers upstream seqs, decodes what the session writes."""

    def __init__(self, session: ProtocolSession, now: int = 0) -> None:
        self.s = session
        self.seq = 0
        self.now = now
        self.sent_ids: list[str] = []
        self.last_raw = b""

    def send(self, mtype: str, payload: Any = None, *, seq: int | None = None,
             channel: str | None = None, now: int | None = None, id: str | None = None):
        if seq is None:
            self.seq += 1
            seq = self.seq
        else:
            self.seq = max(self.seq, seq)
        mid = id or f"c-{seq}"
        self.sent_ids.append(mid)
        self.last_raw = raw(mtype, {} if payload is None else payload, seq=str(seq),
                            channel=channel, id=mid)
        return receive_events(self.s, self.last_raw, self.now if now is None else now)

    def handshake(self, **hello: Any):
        events = self.send("HELLO", hello_payload(**hello))
        out = self.take()
        assert [m["type"] for m in out] == ["HELLO"], out
        self.hello_reply = out[0]
        return events

    def take_raw(self, now: int | None = None) -> list[tuple[int, bytes]]:
        return self.s.take_writable(self.now if now is None else now)

    def take(self, now: int | None = None) -> list[dict[str, Any]]:
        out = []
        for seq, data in self.take_raw(now):
            msg = json.loads(data)
            assert msg["seq"] == str(seq), (seq, msg)
            out.append(msg)
        return out


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in messages]


def errors(messages: list[dict[str, Any]]) -> list[str]:
    return [m["payload"]["code"] for m in messages if m["type"] == "ERROR"]


def seqs(messages: list[dict[str, Any]]) -> list[int]:
    return [int(m["seq"]) for m in messages]
