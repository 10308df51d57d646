"""ServerConfig: defaults <- environment <- Flask app.config <- explicit arguments,
validated at construction.

Every key is declared once in ``OPTIONS`` / ``FLOW_OPTIONS`` (options.py: camelCase name,
snake_case field, environment variable, type, default, bounds); the dataclasses and their
defaults, the env loader, the app.config key names, the validation and the docs table
all come from those declarations.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .core.credits import CreditSettings
from .core.settings import SessionSettings
from .options import (
    FLOW_OPTIONS, OPTIONS, ConfigError, Option, coerce_value, parse_duration, value_from_env,
)

__all__ = [
    "ALL_KEYS", "APP_CONFIG_FLOW", "APP_CONFIG_PREFIX", "FLOW_OPTIONS", "OPTIONS", "ConfigError",
    "FlowControlConfig", "Option", "ServerConfig", "app_config_key", "options_table",
]


ALL_KEYS = {o.key for o in OPTIONS} | {"flowControl"}
#: the shortest operatorToken accepted: it is a password compared as is
MIN_OPERATOR_TOKEN = 16

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
            object.__setattr__(self, opt.attr, coerce_value(opt, getattr(self, opt.attr),
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
    max_user_bytes: int = _DEFAULTS["max_user_bytes"]
    memory_ceiling: int = _DEFAULTS["memory_ceiling"]
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
    redis_sentinels: tuple[str, ...] = _DEFAULTS["redis_sentinels"]
    redis_sentinel_master: str = _DEFAULTS["redis_sentinel_master"]
    redis_prefix: str = _DEFAULTS["redis_prefix"]
    metrics: bool = _DEFAULTS["metrics"]
    dashboard: bool = _DEFAULTS["dashboard"]
    debug_vitals: bool = _DEFAULTS["debug_vitals"]
    operator_token: str | None = field(default=_DEFAULTS["operator_token"], repr=False)

    def __post_init__(self) -> None:
        for opt in OPTIONS:
            object.__setattr__(self, opt.attr, coerce_value(opt, getattr(self, opt.attr), opt.key))
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
            elif not url.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://")):
                raise ConfigError("redisUrl must be a redis://, rediss://, unix:// or "
                                  "redis+sentinel://host:port[,host:port]/master URL")
        self._check_sentinels()
        from .origins import normalize_origin

        try:
            object.__setattr__(self, "allowed_origins",
                               tuple(normalize_origin(o) for o in self.allowed_origins))
        except ValueError as exc:
            raise ConfigError(f"allowedOrigins: {exc}") from None
        if self.operator_token is not None:
            token = self.operator_token.strip()
            if token and len(token) < MIN_OPERATOR_TOKEN:
                raise ConfigError(f"operatorToken must be at least {MIN_OPERATOR_TOKEN} "
                                  "characters (it guards disconnect, send and broadcast)")
            object.__setattr__(self, "operator_token", token or None)
        if "none" in (a.lower() for a in self.jwt_algorithms):
            raise ConfigError("jwtAlgorithms must not contain 'none'")
        if self.jwks_url is not None and not self.jwks_url.startswith(("https://", "http://")):
            raise ConfigError("jwksUrl must be an https:// (or http://) URL")
        if self.jwt_public_key is not None:
            # late: jwt imports ssl, and `protoflask serve` builds its flags from this
            # module before gevent patches ssl
            from .jwks import load_public_keys

            try:
                load_public_keys(self.jwt_public_key)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"jwtPublicKey: {exc}") from None

        try:
            parse_duration(self.jwt_expires_in)
        except ValueError as exc:
            raise ConfigError(f"jwtExpiresIn: {exc}") from None

    def _check_sentinels(self) -> None:
        if not self.redis_sentinels:
            return
        if self.redis_url:
            raise ConfigError("set redisUrl or redisSentinels, not both (a Sentinel URL is "
                              "redis+sentinel://host:port,.../master_name)")
        for entry in self.redis_sentinels:
            host, _, port = entry.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"redisSentinels: {entry!r} is not host:port")
        master = self.redis_sentinel_master.strip()
        if not master or "/" in master or "," in master:
            raise ConfigError(f"redisSentinelMaster: {self.redis_sentinel_master!r} is not "
                              "a master name")
        object.__setattr__(self, "redis_sentinel_master", master)

    @property
    def redis_target(self) -> str | None:
        """The Redis the cluster uses: redisUrl, or the redis+sentinel:// URL that
        redisSentinels and redisSentinelMaster spell; None: no cluster."""
        if self.redis_sentinels:
            return f"redis+sentinel://{','.join(self.redis_sentinels)}/" \
                f"{self.redis_sentinel_master}"
        return self.redis_url

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
                values[opt.attr] = value_from_env(opt, env[opt.env])
        if values.get("dev_mode") and "host" not in values:
            values["host"] = "127.0.0.1"  # a development server is not for the network
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
        out["operatorToken"] = "***" if self.operator_token else None
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
            values[opt.attr] = value_from_env(opt, env[opt.env])
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
                    flow[opt.attr] = coerce_value(opt, raw, f"flowControl.{opt.key} "
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
            flow[opt.attr] = coerce_value(opt, value, f"flowControl.{opt.key} (app.config {key})")
        else:
            top[opt.attr] = coerce_value(opt, value, f"{opt.key} (app.config {key})")
    return top, flow


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

