"""The limits and timings one session runs with.

No defaults here (but for the one limit that is not a configuration key):
``protoflask.config`` declares every default once (``OPTIONS``) and builds these with
``ServerConfig.session_settings()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .credits import CreditSettings


@dataclass(frozen=True, slots=True)
class SessionSettings:
    max_message_size: int
    echo_messages: bool
    max_concurrent_runs: int
    replay_window_size: int
    replay_window_time: int
    replay_window_bytes: int  # the newest message is always kept, whatever its size
    heartbeat_interval: int
    heartbeat_timeout: int
    credits: CreditSettings
    outbound_buffer_size: int  # unsent bytes before the client counts as stuck
    back_pressure_threshold: float  # fraction of it at which USER is paused
    max_open_texts: int
    max_text_size: int  # UTF-8 bytes of one text's content, all its PARTs
    rate_limit: int  # upstream messages per second; 0 turns the limit off
    rate_limit_burst: int
    max_json_depth: int
    # not a configuration key: the core's own bound on queued messages
    max_pending_messages: int = 10000
