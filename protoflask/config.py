"""ServerConfig: defaults <- environment <- Flask app.config <- explicit arguments,
validated at construction.

Every key is declared once in ``OPTIONS`` / ``FLOW_OPTIONS`` (camelCase name, snake_case
field, environment variable, type, default, bounds); the dataclasses, the env loader,
the app.config key names, the validation and the docs table all come from those
declarations.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .core.credits import CreditSettings
from .core.envelope import MAX_JSON_DEPTH
from .core.settings import SessionSettings


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


def _o(key, attr, env, kind, default, doc, low=None, high=None, choices=None) -> Option:
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
    _o("host", "host", "HOST", str, "0.0.0.0", "bind address"),
    _o("jwtSecret", "jwt_secret", "JWT_SECRET", str, None, "HMAC secret for tokens (required)"),
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
       "(503 USER_CONNECTION_LIMIT beyond); unset: max(1, maxConnections // 10)", 1),
    _o("maxKeptSessionsPerUser", "max_kept_sessions_per_user", "MAX_KEPT_SESSIONS_PER_USER",
       int, 10, "disconnected sessions kept per user, per worker; beyond it the oldest "
       "disconnected one is dropped", 0),
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
       "redis://host:port/db shared by every worker and node; unset: sessions in memory, "
       "one worker"),
    _o("redisPrefix", "redis_prefix", "REDIS_PREFIX", str, "protoflask",
       "prefix of every Redis key and channel (one per cluster)"),
    _o("metrics", "metrics", "PROTOFLASK_METRICS", bool, True,
       "serve /metrics (Prometheus text format)"),
    _o("dashboard", "dashboard", "PROTOFLASK_DASHBOARD", bool, True,
       "serve the dashboard and playground page (/, /dashboard) and /dashboard/data"),
    _o("debugVitals", "debug_vitals", "PROTOFLASK_DEBUG_VITALS", bool, False,
       "serve GET /debug/vitals (RSS, greenlets, sessions) for soak tests; never in production"),
)

ALL_KEYS = {o.key for o in OPTIONS} | {"flowControl"}

#: Flask ``app.config`` keys: ``PROTOFLASK_`` + the snake_case field upper-cased
#: (``PROTOFLASK_MAX_CONNECTIONS``); flow-control fields under ``PROTOFLASK_FLOW_CONTROL_``
#: (``PROTOFLASK_FLOW_CONTROL_MIN_CREDITS``), or all of them as one partial dict in
#: ``PROTOFLASK_FLOW_CONTROL``.
APP_CONFIG_PREFIX = "PROTOFLASK_"
APP_CONFIG_FLOW = APP_CONFIG_PREFIX + "FLOW_CONTROL"


def app_config_key(opt: Option, flow: bool = False) -> str:
    """The Flask app.config key of an option."""
    return f"{APP_CONFIG_FLOW}_{opt.attr.upper()}" if flow else \
        f"{APP_CONFIG_PREFIX}{opt.attr.upper()}"


_APP_KEYS: dict[str, tuple[Option, bool]] = {
    **{app_config_key(o): (o, False) for o in OPTIONS},
    **{app_config_key(o, True): (o, True) for o in FLOW_OPTIONS},
}


#: each field's default, written once in OPTIONS / FLOW_OPTIONS
_DEFAULTS: dict[str, Any] = {o.attr: o.default for o in OPTIONS}
_FLOW_DEFAULTS: dict[str, Any] = {o.attr: o.default for o in FLOW_OPTIONS}


def _flow_defaults() -> "FlowControlConfig":
    return FlowControlConfig()


@dataclass(frozen=True)
class FlowControlConfig:
    enabled: bool = _FLOW_DEFAULTS["enabled"]
    initial_credits: int = _FLOW_DEFAULTS["initial_credits"]
    min_credits: int = _FLOW_DEFAULTS["min_credits"]
    max_credits: int = _FLOW_DEFAULTS["max_credits"]
    credit_threshold: int = _FLOW_DEFAULTS["credit_threshold"]
    back_pressure_threshold: float = _FLOW_DEFAULTS["back_pressure_threshold"]
    adaptive_adjustment: bool = _FLOW_DEFAULTS["adaptive_adjustment"]
    initial_credit_messages: int = _FLOW_DEFAULTS["initial_credit_messages"]
    initial_credit_bytes: int = _FLOW_DEFAULTS["initial_credit_bytes"]

    def __post_init__(self) -> None:
        for opt in FLOW_OPTIONS:
            object.__setattr__(self, opt.attr, _coerce(opt, getattr(self, opt.attr),
                                                       f"flowControl.{opt.key}"))
        if self.back_pressure_threshold <= 0:
            raise ConfigError("flowControl.backPressureThreshold must be > 0 and <= 1, got "
                              f"{self.back_pressure_threshold}")
        if self.min_credits > self.max_credits:
            raise ConfigError(f"flowControl.minCredits ({self.min_credits}) must be <= "
                              f"flowControl.maxCredits ({self.max_credits})")


@dataclass(frozen=True)
class ServerConfig:
    port: int = _DEFAULTS["port"]
    host: str = _DEFAULTS["host"]
    jwt_secret: str | None = field(default=_DEFAULTS["jwt_secret"], repr=False)  # never printed
    jwt_expires_in: str = _DEFAULTS["jwt_expires_in"]
    jwt_algorithms: tuple[str, ...] = _DEFAULTS["jwt_algorithms"]
    jwt_public_key: str | None = _DEFAULTS["jwt_public_key"]
    jwks_url: str | None = _DEFAULTS["jwks_url"]
    jwks_refresh_interval: int = _DEFAULTS["jwks_refresh_interval"]
    jwt_audience: str | None = _DEFAULTS["jwt_audience"]
    jwt_issuer: str | None = _DEFAULTS["jwt_issuer"]
    jwt_require_exp: bool = _DEFAULTS["jwt_require_exp"]
    max_connections: int = _DEFAULTS["max_connections"]
    max_connections_per_user: int | None = _DEFAULTS["max_connections_per_user"]
    max_kept_sessions_per_user: int = _DEFAULTS["max_kept_sessions_per_user"]
    body_timeout: int = _DEFAULTS["body_timeout"]
    heartbeat_interval: int = _DEFAULTS["heartbeat_interval"]
    heartbeat_timeout: int = _DEFAULTS["heartbeat_timeout"]
    flow_control: FlowControlConfig = field(default_factory=_flow_defaults)
    max_concurrent_runs: int = _DEFAULTS["max_concurrent_runs"]
    tool_queue_size: int = _DEFAULTS["tool_queue_size"]
    tool_timeout: int = _DEFAULTS["tool_timeout"]
    replay_window_size: int = _DEFAULTS["replay_window_size"]
    replay_window_time: int = _DEFAULTS["replay_window_time"]
    replay_window_bytes: int = _DEFAULTS["replay_window_bytes"]
    max_open_texts: int = _DEFAULTS["max_open_texts"]
    max_text_size: int = _DEFAULTS["max_text_size"]
    max_message_size: int = _DEFAULTS["max_message_size"]
    outbound_buffer_size: int = _DEFAULTS["outbound_buffer_size"]
    max_json_depth: int = _DEFAULTS["max_json_depth"]
    rate_limit: int = _DEFAULTS["rate_limit"]
    rate_limit_burst: int = _DEFAULTS["rate_limit_burst"]
    allowed_origins: tuple[str, ...] = _DEFAULTS["allowed_origins"]
    echo_messages: bool = _DEFAULTS["echo_messages"]
    enable_cors: bool = _DEFAULTS["enable_cors"]
    enable_compression: bool = _DEFAULTS["enable_compression"]
    enable_logging: bool = _DEFAULTS["enable_logging"]
    node_env: str = _DEFAULTS["node_env"]
    dev_mode: bool = _DEFAULTS["dev_mode"]
    redis_url: str | None = field(default=_DEFAULTS["redis_url"], repr=False)  # may hold a password
    redis_prefix: str = _DEFAULTS["redis_prefix"]
    metrics: bool = _DEFAULTS["metrics"]
    dashboard: bool = _DEFAULTS["dashboard"]
    debug_vitals: bool = _DEFAULTS["debug_vitals"]

    def __post_init__(self) -> None:
        for opt in OPTIONS:
            object.__setattr__(self, opt.attr, _coerce(opt, getattr(self, opt.attr), opt.key))
        fc = self.flow_control
        if isinstance(fc, Mapping):
            fc = _flow_from_mapping(fc, {})
        if not isinstance(fc, FlowControlConfig):
            raise ConfigError(f"flowControl must be an object, got {fc!r}")
        object.__setattr__(self, "flow_control", fc)
        if self.redis_url is not None:
            url = self.redis_url.strip()
            if not url:
                object.__setattr__(self, "redis_url", None)
            elif not url.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError("redisUrl must be a redis://, rediss:// or unix:// URL")
        from .origins import normalize_origin

        try:
            object.__setattr__(self, "allowed_origins",
                               tuple(normalize_origin(o) for o in self.allowed_origins))
        except ValueError as exc:
            raise ConfigError(f"allowedOrigins: {exc}") from None
        if "none" in (a.lower() for a in self.jwt_algorithms):
            raise ConfigError("jwtAlgorithms must not contain 'none'")
        if self.jwks_url is not None and not self.jwks_url.startswith(("https://", "http://")):
            raise ConfigError("jwksUrl must be an https:// (or http://) URL")
        from .auth import load_public_keys, parse_duration  # late: auth needs nothing here

        if self.jwt_public_key is not None:
            try:
                load_public_keys(self.jwt_public_key)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"jwtPublicKey: {exc}") from None

        try:
            parse_duration(self.jwt_expires_in)
        except ValueError as exc:
            raise ConfigError(f"jwtExpiresIn: {exc}") from None

    # -- construction -------------------------------------------------------------------

    @classmethod
    def load(cls, config: "ServerConfig | Mapping[str, Any] | None" = None,
             environ: Mapping[str, str] | None = None,
             app_config: Mapping[str, Any] | None = None) -> "ServerConfig":
        """Defaults, overridden by the environment, overridden by a Flask app's
        ``PROTOFLASK_*`` keys (``app_config``), overridden by ``config``.

        ``config`` may be a partial camelCase dict (nested partial flowControl,
        snake_case keys also accepted) or a ServerConfig (complete: taken as is).
        """
        if isinstance(config, ServerConfig):
            return config
        env = os.environ if environ is None else environ
        explicit = dict(config or {})
        unknown = set(explicit) - ALL_KEYS - {o.attr for o in OPTIONS} - {"flow_control"}
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(sorted(unknown))}")
        from_app, flow_from_app = _from_app_config(app_config or {})
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            if opt.key in explicit or opt.attr in explicit:
                values[opt.attr] = explicit.get(opt.key, explicit.get(opt.attr))
            elif opt.attr in from_app:
                values[opt.attr] = from_app[opt.attr]
            elif opt.env and opt.env in env:
                values[opt.attr] = _from_env(opt, env[opt.env])
        flow = explicit.get("flowControl", explicit.get("flow_control", {}))
        if isinstance(flow, FlowControlConfig):
            values["flow_control"] = flow
        elif isinstance(flow, Mapping):
            values["flow_control"] = _flow_from_mapping(flow, env, flow_from_app)
        else:
            raise ConfigError(f"flowControl must be an object, got {flow!r}")
        return cls(**values)

    def replace(self, **changes: Any) -> "ServerConfig":
        return dataclasses.replace(self, **changes)

    def differences(self, other: "ServerConfig") -> list[str]:
        """The keys whose values differ (``flowControl.<key>`` for flow control)."""
        out = [o.key for o in OPTIONS if getattr(self, o.attr) != getattr(other, o.attr)]
        return out + [f"flowControl.{o.key}" for o in FLOW_OPTIONS
                      if getattr(self.flow_control, o.attr) != getattr(other.flow_control,
                                                                       o.attr)]

    @property
    def connections_per_user(self) -> int:
        """maxConnectionsPerUser, or its default: a tenth of maxConnections (at least 1)."""
        if self.max_connections_per_user is not None:
            return self.max_connections_per_user
        return max(1, self.max_connections // 10)

    # -- derived settings for the core ---------------------------------------------------

    def session_settings(self) -> SessionSettings:
        fc = self.flow_control
        return SessionSettings(
            max_message_size=self.max_message_size,
            echo_messages=self.echo_messages,
            max_concurrent_runs=self.max_concurrent_runs,
            replay_window_size=self.replay_window_size,
            replay_window_time=self.replay_window_time,
            replay_window_bytes=self.replay_window_bytes,
            max_open_texts=self.max_open_texts,
            max_text_size=self.max_text_size,
            heartbeat_interval=self.heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            outbound_buffer_size=self.outbound_buffer_size,
            back_pressure_threshold=fc.back_pressure_threshold,
            rate_limit=self.rate_limit,
            rate_limit_burst=self.rate_limit_burst,
            max_json_depth=self.max_json_depth,
            credits=CreditSettings(
                enabled=fc.enabled, initial_credits=fc.initial_credits,
                min_credits=fc.min_credits, max_credits=fc.max_credits,
                credit_threshold=fc.credit_threshold,
                adaptive_adjustment=fc.adaptive_adjustment,
                initial_credit_messages=fc.initial_credit_messages,
                initial_credit_bytes=fc.initial_credit_bytes,
            ),
        )

    def to_public_dict(self) -> dict[str, Any]:
        """camelCase view with the secret masked (for logs and /stats consumers)."""
        out = {o.key: getattr(self, o.attr) for o in OPTIONS}
        out["jwtSecret"] = "***" if self.jwt_secret else None
        out["jwtAlgorithms"] = list(self.jwt_algorithms)
        out["flowControl"] = {o.key: getattr(self.flow_control, o.attr) for o in FLOW_OPTIONS}
        return out


def _flow_from_mapping(flow: Mapping[str, Any], env: Mapping[str, str],
                       from_app: Mapping[str, Any] | None = None) -> FlowControlConfig:
    _check_flow_keys(flow, "flowControl")
    from_app = from_app or {}
    values: dict[str, Any] = {}
    for opt in FLOW_OPTIONS:
        if opt.key in flow or opt.attr in flow:
            values[opt.attr] = flow.get(opt.key, flow.get(opt.attr))
        elif opt.attr in from_app:
            values[opt.attr] = from_app[opt.attr]
        elif opt.env and opt.env in env:
            values[opt.attr] = _from_env(opt, env[opt.env])
    return FlowControlConfig(**values)


def _check_flow_keys(flow: Mapping[str, Any], where: str) -> None:
    known = {o.key for o in FLOW_OPTIONS} | {o.attr for o in FLOW_OPTIONS}
    unknown = set(flow) - known
    if unknown:
        raise ConfigError(f"unknown {where} key(s): {', '.join(sorted(unknown))}")


def _from_app_config(app_config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``PROTOFLASK_*`` keys of a Flask app.config as (top-level, flowControl) values
    by snake_case field, each checked with the app.config key in its error. A key whose
    value is None counts as not set; an unknown ``PROTOFLASK_*`` key is an error."""
    top: dict[str, Any] = {}
    flow: dict[str, Any] = {}
    for key in sorted(k for k in app_config if isinstance(k, str)
                      and k.startswith(APP_CONFIG_PREFIX)):
        value = app_config[key]
        if value is None:
            continue
        if key == APP_CONFIG_FLOW:
            if not isinstance(value, Mapping):
                raise ConfigError(f"flowControl (app.config {key}) must be a dict, got {value!r}")
            _check_flow_keys(value, f"app.config {key}")
            for opt in FLOW_OPTIONS:
                raw = value.get(opt.key, value.get(opt.attr))
                if raw is not None:
                    flow[opt.attr] = _coerce(opt, raw, f"flowControl.{opt.key} "
                                                       f"(app.config {key})")
            continue
        if key not in _APP_KEYS:
            by_env = [app_config_key(o, f) for o, f in _APP_KEYS.values()
                      if o.env in (key, key[len(APP_CONFIG_PREFIX):])]
            close = by_env or difflib.get_close_matches(key, [*_APP_KEYS, APP_CONFIG_FLOW], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"unknown app.config key {key}{hint} (protoflask reads "
                              f"{APP_CONFIG_PREFIX}<OPTION> keys; see the configuration table)")
        opt, is_flow = _APP_KEYS[key]
        if is_flow:
            if opt.attr in flow:
                raise ConfigError(f"flowControl.{opt.key} is set twice in app.config: in "
                                  f"{APP_CONFIG_FLOW} and as {key}; keep one")
            flow[opt.attr] = _coerce(opt, value, f"flowControl.{opt.key} (app.config {key})")
        else:
            top[opt.attr] = _coerce(opt, value, f"{opt.key} (app.config {key})")
    return top, flow


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _from_env(opt: Option, raw: str) -> Any:
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


def _coerce(opt: Option, value: Any, name: str) -> Any:
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


def options_table() -> str:
    """A Markdown table of every key (for docs; generated so it cannot drift)."""
    rows = ["| Key | app.config | Env | Type | Default | Meaning |",
            "|---|---|---|---|---|---|"]
    for prefix, opts in (("", OPTIONS), ("flowControl.", FLOW_OPTIONS)):
        for o in opts:
            default = (",".join(o.default) or "empty") if isinstance(o.default, tuple) \
                else o.default
            rows.append(f"| {prefix}{o.key} | {app_config_key(o, bool(prefix))} | "
                        f"{o.env or ''} | {o.kind.__name__} | "
                        f"{'none' if default is None else default} | {o.doc} |")
    return "\n".join(rows)

