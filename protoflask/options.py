"""Every configuration key declared once (camelCase name, snake_case field, environment
variable, type, default, bounds, meaning), and how a raw value becomes a checked one.

``protoflask.config`` builds ServerConfig from these; its field defaults are the
``default`` here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .core.envelope import MAX_JSON_DEPTH


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


@dataclass(frozen=True)
class Option:
    key: str  # camelCase, as the spec writes it
    attr: str  # snake_case field
    env: str | None
    kind: type  # int, float, bool, str, list
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None


def _o(key: str, attr: str, env: str | None, kind: type, default: Any, doc: str,
       low: float | None = None, high: float | None = None,
       choices: tuple[str, ...] | None = None) -> Option:
    return Option(key, attr, env, kind, default, doc, low, high, choices)


FLOW_OPTIONS: tuple[Option, ...] = (
    _o("enabled", "enabled", "FLOW_CONTROL_ENABLED", bool, True, "credit-based flow control on"),
    _o("initialCredits", "initial_credits", "FLOW_CONTROL_INITIAL_CREDITS", int, 1000,
       "downstream credit per channel of a client that asks for downstream credit without"
       " announcing its own; fixed grant size without adaptiveAdjustment", 1),
    _o("minCredits", "min_credits", "FLOW_CONTROL_MIN_CREDITS", int, 100,
       "smallest adaptive grant", 1),
    _o("maxCredits", "max_credits", "FLOW_CONTROL_MAX_CREDITS", int, 10000,
       "largest adaptive grant", 1),
    _o("creditThreshold", "credit_threshold", "FLOW_CONTROL_CREDIT_THRESHOLD", int, 200,
       "remaining message credit at which the server tops a channel up", 0),
    _o("backPressureThreshold", "back_pressure_threshold",
       "FLOW_CONTROL_BACK_PRESSURE_THRESHOLD", float, 0.8,
       "fraction of the outbound buffer at which USER is paused (resumed at a quarter of"
       " that)", 0.0, 1.0),
    _o("adaptiveAdjustment", "adaptive_adjustment", "FLOW_CONTROL_ADAPTIVE_ADJUSTMENT", bool,
       True, "grow/shrink grants with load"),
    _o("initialCreditMessages", "initial_credit_messages", "FLOW_CONTROL_INITIAL_CREDIT_MESSAGES",
       int, 1000, "message credits granted to the client per channel", 1),
    _o("initialCreditBytes", "initial_credit_bytes", "FLOW_CONTROL_INITIAL_CREDIT_BYTES", int,
       1048576, "byte credits granted to the client per channel", 1),
)

OPTIONS: tuple[Option, ...] = (
    _o("port", "port", "PORT", int, 8080, "TCP port (0 picks a free one)", 0, 65535),
    _o("host", "host", "HOST", str, "0.0.0.0", "bind address (127.0.0.1 in devMode)"),
    _o("jwtSecret", "jwt_secret", "JWT_SECRET", str, None,
       "HMAC secret for tokens (required unless jwtPublicKey or jwksUrl is set)"),
    _o("jwtExpiresIn", "jwt_expires_in", "JWT_EXPIRES_IN", str, "24h",
       "lifetime of issued tokens: 30s, 15m, 24h, 7d or seconds"),
    _o("jwtAlgorithms", "jwt_algorithms", "JWT_ALGORITHMS", list, ("HS256",),
       "accepted JWT algorithms (comma-separated in the env); public keys accept their "
       "own type's unless asymmetric ones are named here"),
    _o("jwtPublicKey", "jwt_public_key", "JWT_PUBLIC_KEY", str, None,
       "PEM public key(s) or certificate, or a path to a .pem file, for RS/PS/ES/EdDSA tokens"),
    _o("jwksUrl", "jwks_url", "JWKS_URL", str, None,
       "identity provider's JWKS URL (keys fetched only from here, cached)"),
    _o("jwksRefreshInterval", "jwks_refresh_interval", "JWKS_REFRESH_INTERVAL", int, 60000,
       "least ms between two JWKS fetches (a token with an unknown kid refreshes at most "
       "once per interval)", 100),
    _o("jwtAudience", "jwt_audience", "JWT_AUDIENCE", str, None,
       "required aud claim of tokens (unset: not checked)"),
    _o("jwtIssuer", "jwt_issuer", "JWT_ISSUER", str, None,
       "required iss claim of tokens (unset: not checked)"),
    _o("maxConnections", "max_connections", "MAX_CONNECTIONS", int, 1000,
       "simultaneous live transports", 1),
    _o("maxConnectionsPerUser", "max_connections_per_user", "MAX_CONNECTIONS_PER_USER", int,
       None, "live transports per user, and concurrent POST bodies per user, per worker "
       "(503 USER_CONNECTION_LIMIT beyond); unset: max(1, maxConnections // 10), and then "
       "a user holding maxConnections // 100 or more may not take the last tenth of the "
       "slots (kept for lighter users)", 1),
    _o("maxKeptSessionsPerUser", "max_kept_sessions_per_user", "MAX_KEPT_SESSIONS_PER_USER",
       int, 10, "disconnected sessions kept per user, per worker; beyond it the oldest "
       "disconnected one is dropped", 0),
    _o("maxUserBytes", "max_user_bytes", "MAX_USER_BYTES", int, 256 << 20,
       "bytes of memory all of one user's sessions (live and kept) may hold, per worker "
       "(texts, tool calls' params, runs, replay windows): a text part, tool call or run "
       "that would exceed it is refused (MESSAGE_TOO_LARGE / MAX_RUNS_EXCEEDED), new "
       "sessions too (503 USER_CONNECTION_LIMIT); over it, the user's oldest kept sessions "
       "are dropped, then their heaviest session is closed; 0: no budget",
       0),
    _o("memoryCeiling", "memory_ceiling", "MEMORY_CEILING", int, 768 << 20,
       "bytes of memory all sessions of a worker may hold: what would exceed it is refused "
       "as for maxUserBytes, new sessions with 503 MAX_CONNECTIONS; over it, the oldest "
       "kept sessions are dropped, then the heaviest session is closed; 0: no ceiling", 0),
    _o("bodyTimeout", "body_timeout", "BODY_TIMEOUT", int, 30000,
       "ms to read a POST body (408 REQUEST_TIMEOUT beyond); also how long an open stream "
       "body may stall inside a line before its response ends", 1),
    _o("jwtRequireExp", "jwt_require_exp", "JWT_REQUIRE_EXP", bool, True,
       "refuse tokens without an exp claim (INVALID_TOKEN)"),
    _o("heartbeatInterval", "heartbeat_interval", "HEARTBEAT_INTERVAL", int, 30000,
       "ms between server PINGs", 1),
    _o("heartbeatTimeout", "heartbeat_timeout", "HEARTBEAT_TIMEOUT", int, 5000,
       "ms to wait for the matching PONG", 1),
    _o("maxConcurrentRuns", "max_concurrent_runs", "MAX_CONCURRENT_RUNS", int, 10,
       "active runs and concurrent tool executions per session", 1),
    _o("toolQueueSize", "tool_queue_size", "TOOL_QUEUE_SIZE", int, 100,
       "tool calls waiting per session beyond maxConcurrentRuns", 0),
    _o("toolTimeout", "tool_timeout", "TOOL_TIMEOUT", int, 60000,
       "ms a tool may run before TOOL_EXECUTION_ERROR", 1),
    _o("replayWindowSize", "replay_window_size", "REPLAY_WINDOW_SIZE", int, 1000,
       "downstream messages kept per session for resume", 1),
    _o("replayWindowTime", "replay_window_time", "REPLAY_WINDOW_TIME", int, 60000,
       "ms messages stay replayable; also how long a disconnected session is kept", 1),
    _o("replayWindowBytes", "replay_window_bytes", "REPLAY_WINDOW_BYTES", int, 4194304,
       "bytes of downstream messages kept per session for resume (oldest evicted first, "
       "the newest always kept); at most outboundBufferSize, or a client resuming a full "
       "window on a slow link may be closed as a slow consumer", 1024),
    _o("maxOpenTexts", "max_open_texts", "MAX_OPEN_TEXTS", int, 8,
       "texts a session may have started and not ended (INVALID_MESSAGE beyond)", 1),
    _o("maxTextSize", "max_text_size", "MAX_TEXT_SIZE", int, 4194304,
       "UTF-8 bytes of one text's content over all its PARTs (MESSAGE_TOO_LARGE beyond, "
       "the text discarded)", 1),
    _o("maxMessageSize", "max_message_size", "MAX_MESSAGE_SIZE", int, 1048576,
       "bytes per envelope", 64),
    _o("outboundBufferSize", "outbound_buffer_size", "OUTBOUND_BUFFER_SIZE", int, 4194304,
       "unsent bytes a session may hold for a slow client", 1024),
    _o("maxJsonDepth", "max_json_depth", "MAX_JSON_DEPTH", int, MAX_JSON_DEPTH,
       "deepest JSON nesting accepted in an envelope (INVALID_MESSAGE beyond)", 2, 200),
    _o("rateLimit", "rate_limit", "RATE_LIMIT", int, 1000,
       "upstream messages per second per session (RATE_LIMITED beyond; 0 = off)", 0),
    _o("rateLimitBurst", "rate_limit_burst", "RATE_LIMIT_BURST", int, 2000,
       "messages a session may send at once before rateLimit applies", 1),
    _o("allowedOrigins", "allowed_origins", "ALLOWED_ORIGINS", list, (),
       "browser Origins allowed on /proto/* (comma-separated in the env; empty = any)"),
    _o("echoMessages", "echo_messages", "ECHO_MESSAGES", bool, True,
       "answer each completed text with the same text on AGENT"),
    _o("enableCORS", "enable_cors", "ENABLE_CORS", bool, True, "CORS headers and preflight"),
    _o("enableCompression", "enable_compression", "ENABLE_COMPRESSION", bool, True,
       "gzip JSON responses, permessage-deflate on WebSocket"),
    _o("enableLogging", "enable_logging", "ENABLE_LOGGING", bool, True,
       "access and connection logs (never one line per message)"),
    _o("nodeEnv", "node_env", "NODE_ENV", str, "production", "environment name",
       choices=("development", "production", "test")),
    _o("devMode", "dev_mode", "PROTOFLASK_DEV", bool, False,
       "development mode: generate a secret when none is given and print a token"),
    _o("redisUrl", "redis_url", "REDIS_URL", str, None,
       "redis://host:port/db shared by every worker and node (or "
       "redis+sentinel://host:port[,host:port]/master_name[/db]: the master Redis Sentinel "
       "names, followed through a failover); unset: sessions in memory, one worker"),
    _o("redisSentinels", "redis_sentinels", "REDIS_SENTINELS", list, (),
       "Redis Sentinel host:port list (comma-separated in the env) naming the master "
       "redisSentinelMaster, followed through a failover; instead of redisUrl (the same as "
       "redisUrl redis+sentinel://host:port,.../master_name)"),
    _o("redisSentinelMaster", "redis_sentinel_master", "REDIS_SENTINEL_MASTER", str,
       "mymaster", "the master name the sentinels of redisSentinels watch"),
    _o("redisPrefix", "redis_prefix", "REDIS_PREFIX", str, "protoflask",
       "prefix of every Redis key and channel (one per cluster)"),
    _o("metrics", "metrics", "PROTOFLASK_METRICS", bool, True,
       "serve /metrics (Prometheus text format)"),
    _o("dashboard", "dashboard", "PROTOFLASK_DASHBOARD", bool, True,
       "serve the dashboard and playground page (/, /dashboard) and /dashboard/data"),
    _o("operatorToken", "operator_token", "OPERATOR_TOKEN", str, None,
       "the operator's credential (Bearer, at least 16 characters; not a user token) for "
       "the dashboard's disconnect, send and broadcast; unset: those are off (404)"),
    _o("debugVitals", "debug_vitals", "PROTOFLASK_DEBUG_VITALS", bool, False,
       "serve GET /debug/vitals (RSS, greenlets, sessions) for soak tests; never in production"),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def value_from_env(opt: Option, raw: str) -> Any:
    """Environment strings become typed values (errors name the variable)."""
    raw = raw.strip()
    try:
        if opt.kind is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError(f"expected true/false, got {raw!r}")
        if opt.kind is int:
            return int(raw)
        if opt.kind is float:
            return float(raw)
        if opt.kind is list:
            return tuple(p.strip() for p in raw.split(",") if p.strip())
    except ValueError as exc:
        raise ConfigError(f"{opt.key} (env {opt.env}): {exc}") from None
    return raw


def coerce_value(opt: Option, value: Any, name: str) -> Any:
    """Check a value's type and bounds; the error names the key."""
    if value is None:
        if opt.default is None:
            return None
        raise ConfigError(f"{name} must not be null")
    kind = opt.kind
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be a boolean, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        try:
            number = int(value) if not isinstance(value, float) else value
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
        if isinstance(number, float):
            if not number.is_integer():
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            number = int(number)
        value = number
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {value!r}") from None
    elif kind is str:
        if opt.key == "jwtExpiresIn" and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            # docs/PROTOCOL.md §1.1 Authentication: a number of seconds may be given as a number
            if isinstance(value, float) and not value.is_integer():
                raise ConfigError(f"{name} must be a whole number of seconds, got {value!r}")
            value = str(int(value))
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r}")
    elif kind is list:
        if isinstance(value, str):
            value = tuple(p.strip() for p in value.split(",") if p.strip())
        may_be_empty = opt.default == ()
        if not isinstance(value, (list, tuple)) or (not value and not may_be_empty) or \
                not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{name} must be a{'' if may_be_empty else ' non-empty'} list of "
                              f"strings, got {value!r}")
        value = tuple(value)
    if opt.low is not None and value < opt.low:
        raise ConfigError(f"{name} must be >= {opt.low:g}, got {value!r}")
    if opt.high is not None and value > opt.high:
        raise ConfigError(f"{name} must be <= {opt.high:g}, got {value!r}")
    if opt.choices is not None and value not in opt.choices:
        raise ConfigError(f"{name} must be one of {', '.join(opt.choices)}, got {value!r}")
    return value


_DURATION = re.compile(r"\s*(\d+)\s*([smhd]?)\s*\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> int:
    """'30s', '15m', '24h', '7d', or a number of seconds (number or numeric string)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"duration must be positive, got {value!r}")
        return int(value)
    match = _DURATION.match(str(value))
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"expected a duration like 30s, 15m, 24h, 7d or seconds, got {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]
