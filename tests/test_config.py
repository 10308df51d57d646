"""Configuration (README.md Configuration): defaults, env vars, precedence,
camelCase / snake_case input, validation at construction, jwtSecret and dev mode."""

from __future__ import annotations

import dataclasses

import pytest

from protoflask import ConfigError, FlowControlConfig, ProtoServer, ServerConfig
from protoflask.auth import TokenAuthority

from .support import SECRET

# (camelCase key, snake_case attr, env var, default, a non-default value, its env spelling)
TOP_LEVEL = [
    ("port", "port", "PORT", 8080, 9090, "9090"),
    ("host", "host", "HOST", "0.0.0.0", "127.0.0.1", "127.0.0.1"),
    ("jwtSecret", "jwt_secret", "JWT_SECRET", None, "from-somewhere", "from-somewhere"),
    ("jwtExpiresIn", "jwt_expires_in", "JWT_EXPIRES_IN", "24h", "15m", "15m"),
    ("maxConnections", "max_connections", "MAX_CONNECTIONS", 1000, 7, "7"),
    ("heartbeatInterval", "heartbeat_interval", "HEARTBEAT_INTERVAL", 30000, 1500, "1500"),
    ("heartbeatTimeout", "heartbeat_timeout", "HEARTBEAT_TIMEOUT", 5000, 700, "700"),
    ("maxConcurrentRuns", "max_concurrent_runs", "MAX_CONCURRENT_RUNS", 10, 3, "3"),
    ("replayWindowSize", "replay_window_size", "REPLAY_WINDOW_SIZE", 1000, 50, "50"),
    ("replayWindowTime", "replay_window_time", "REPLAY_WINDOW_TIME", 60000, 2500, "2500"),
    ("maxMessageSize", "max_message_size", "MAX_MESSAGE_SIZE", 1048576, 4096, "4096"),
    ("echoMessages", "echo_messages", "ECHO_MESSAGES", True, False, "false"),
    ("toolQueueSize", "tool_queue_size", "TOOL_QUEUE_SIZE", 100, 4, "4"),
    ("enableCORS", "enable_cors", "ENABLE_CORS", True, False, "false"),
    ("enableCompression", "enable_compression", "ENABLE_COMPRESSION", True, False, "0"),
    ("enableLogging", "enable_logging", "ENABLE_LOGGING", True, False, "no"),
    ("nodeEnv", "node_env", "NODE_ENV", "production", "development", "development"),
]

FLOW = [
    ("enabled", "enabled", "FLOW_CONTROL_ENABLED", True, False, "false"),
    ("initialCredits", "initial_credits", "FLOW_CONTROL_INITIAL_CREDITS", 1000, 300, "300"),
    ("minCredits", "min_credits", "FLOW_CONTROL_MIN_CREDITS", 100, 20, "20"),
    ("maxCredits", "max_credits", "FLOW_CONTROL_MAX_CREDITS", 10000, 500, "500"),
    ("creditThreshold", "credit_threshold", "FLOW_CONTROL_CREDIT_THRESHOLD", 200, 0, "0"),
    ("backPressureThreshold", "back_pressure_threshold",
     "FLOW_CONTROL_BACK_PRESSURE_THRESHOLD", 0.8, 0.5, "0.5"),
    ("adaptiveAdjustment", "adaptive_adjustment", "FLOW_CONTROL_ADAPTIVE_ADJUSTMENT", True,
     False, "false"),
    ("initialCreditMessages", "initial_credit_messages",
     "FLOW_CONTROL_INITIAL_CREDIT_MESSAGES", 1000, 5, "5"),
    ("initialCreditBytes", "initial_credit_bytes", "FLOW_CONTROL_INITIAL_CREDIT_BYTES",
     1048576, 2048, "2048"),
]

ALL_ENV_VARS = [row[2] for row in TOP_LEVEL + FLOW] + ["JWT_ALGORITHMS", "PROTOFLASK_DEV"]


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process environment must not leak into tests that read it."""
    for name in ALL_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


# -- defaults -------------------------------------------------------------------------


@pytest.mark.parametrize("key,attr,env,default,other,raw", TOP_LEVEL,
                         ids=[r[0] for r in TOP_LEVEL])
def test_top_level_default(key, attr, env, default, other, raw) -> None:
    assert getattr(ServerConfig(), attr) == default
    assert getattr(ServerConfig.load({}, environ={}), attr) == default


@pytest.mark.parametrize("key,attr,env,default,other,raw", FLOW, ids=[r[0] for r in FLOW])
def test_flow_control_default(key, attr, env, default, other, raw) -> None:
    assert getattr(ServerConfig().flow_control, attr) == default
    assert getattr(ServerConfig.load({}, environ={}).flow_control, attr) == default
    assert getattr(FlowControlConfig(), attr) == default


def test_defaults_not_in_the_spec_table() -> None:
    config = ServerConfig.load(None, environ={})
    assert config.max_concurrent_runs == 10
    assert config.replay_window_size == 1000
    assert config.replay_window_time == 60000
    assert config.max_message_size == 1048576
    assert config.echo_messages is True
    assert config.jwt_algorithms == ("HS256",)
    assert config.tool_queue_size == 100
    assert config.jwt_secret is None


# -- environment ----------------------------------------------------------------------


@pytest.mark.parametrize("key,attr,env,default,other,raw", TOP_LEVEL,
                         ids=[r[0] for r in TOP_LEVEL])
def test_top_level_env_var(key, attr, env, default, other, raw) -> None:
    config = ServerConfig.load(environ={env: raw})
    assert getattr(config, attr) == other


@pytest.mark.parametrize("key,attr,env,default,other,raw", FLOW, ids=[r[0] for r in FLOW])
def test_flow_control_env_var(key, attr, env, default, other, raw) -> None:
    config = ServerConfig.load(environ={env: raw})
    assert getattr(config.flow_control, attr) == other


def test_jwt_algorithms_env_is_comma_separated() -> None:
    config = ServerConfig.load(environ={"JWT_ALGORITHMS": "HS256, HS512"})
    assert config.jwt_algorithms == ("HS256", "HS512")


def test_load_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_CONNECTIONS", "42")
    monkeypatch.setenv("FLOW_CONTROL_MIN_CREDITS", "7")
    config = ServerConfig.load({"port": 1})
    assert config.max_connections == 42
    assert config.flow_control.min_credits == 7


def test_invalid_env_value_names_key_and_variable() -> None:
    with pytest.raises(ConfigError, match="maxConnections.*MAX_CONNECTIONS"):
        ServerConfig.load(environ={"MAX_CONNECTIONS": "lots"})
    with pytest.raises(ConfigError, match="enableCORS"):
        ServerConfig.load(environ={"ENABLE_CORS": "maybe"})


# -- explicit input: camelCase dict, snake_case dataclass -----------------------------


def test_partial_camel_case_dict_with_nested_partial_flow_control() -> None:
    config = ServerConfig.load({"port": 0, "jwtSecret": "s", "maxConcurrentRuns": 2,
                                "flowControl": {"minCredits": 5, "backPressureThreshold": 0.5}},
                               environ={})
    assert (config.port, config.jwt_secret, config.max_concurrent_runs) == (0, "s", 2)
    fc = config.flow_control
    assert fc.min_credits == 5 and fc.back_pressure_threshold == 0.5
    # untouched keys keep their defaults, at both levels
    assert fc.max_credits == 10000 and fc.initial_credits == 1000 and fc.enabled is True
    assert config.host == "0.0.0.0" and config.heartbeat_interval == 30000


def test_protoserver_accepts_camel_case_dict() -> None:
    server = ProtoServer({"jwtSecret": SECRET, "port": 0, "enableCORS": False,
                          "flowControl": {"initialCreditMessages": 9}})
    assert server.config.enable_cors is False
    assert server.config.flow_control.initial_credit_messages == 9
    assert server.config.flow_control.max_credits == 10000


def test_snake_case_dataclasses() -> None:
    flow = FlowControlConfig(min_credits=3, max_credits=30)
    config = ServerConfig(port=0, jwt_secret="s", max_connections=5, flow_control=flow)
    assert config.flow_control is flow
    assert config.max_connections == 5
    # ProtoServer takes the dataclass as is
    server = ProtoServer(config)
    assert server.config is config


def test_snake_case_keys_in_a_dict() -> None:
    config = ServerConfig.load({"max_connections": 3, "flow_control": {"min_credits": 2}},
                               environ={})
    assert config.max_connections == 3 and config.flow_control.min_credits == 2


def test_flow_control_given_as_dict_to_the_dataclass() -> None:
    config = ServerConfig(flow_control={"maxCredits": 400})  # type: ignore[arg-type]
    assert isinstance(config.flow_control, FlowControlConfig)
    assert config.flow_control.max_credits == 400


def test_dataclass_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ServerConfig().port = 1  # type: ignore[misc]


# -- precedence -----------------------------------------------------------------------


def test_precedence_explicit_over_env_over_default() -> None:
    env = {"PORT": "9000", "HOST": "10.0.0.1", "FLOW_CONTROL_MIN_CREDITS": "11",
           "FLOW_CONTROL_MAX_CREDITS": "222"}
    config = ServerConfig.load({"port": 1234, "flowControl": {"minCredits": 7}}, environ=env)
    assert config.port == 1234  # explicit beats env
    assert config.host == "10.0.0.1"  # env beats default
    assert config.flow_control.min_credits == 7  # explicit nested beats env
    assert config.flow_control.max_credits == 222  # env for a nested key not given
    assert config.max_connections == 1000  # default when neither


def test_explicit_false_beats_env_true() -> None:
    config = ServerConfig.load({"enableLogging": False}, environ={"ENABLE_LOGGING": "true"})
    assert config.enable_logging is False


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize("config,key", [
    ({"port": "abc"}, "port"),
    ({"maxConnections": "abc"}, "maxConnections"),
    ({"flowControl": {"initialCredits": "abc"}}, "initialCredits"),
    ({"flowControl": {"backPressureThreshold": "abc"}}, "backPressureThreshold"),
    ({"port": 70000}, "port"),
    ({"port": -1}, "port"),
    ({"flowControl": {"backPressureThreshold": 1.5}}, "backPressureThreshold"),
    ({"flowControl": {"backPressureThreshold": 0}}, "backPressureThreshold"),
    ({"flowControl": {"minCredits": 500, "maxCredits": 100}}, "minCredits"),
    ({"flowControl": {"initialCreditMessages": 0}}, "initialCreditMessages"),
    ({"flowControl": {"creditThreshold": -1}}, "creditThreshold"),
    ({"enableCORS": "yes please"}, "enableCORS"),
    ({"maxConcurrentRuns": 1.5}, "maxConcurrentRuns"),
    ({"jwtExpiresIn": "soon"}, "jwtExpiresIn"),
    ({"jwtExpiresIn": "-5m"}, "jwtExpiresIn"),
    ({"jwtAlgorithms": ["HS256", "none"]}, "jwtAlgorithms"),
    ({"jwtAlgorithms": ["NONE"]}, "jwtAlgorithms"),
    ({"jwtAlgorithms": []}, "jwtAlgorithms"),
    ({"nodeEnv": "staging"}, "nodeEnv"),
    ({"flowControl": "on"}, "flowControl"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_invalid_values_fail_at_construction_naming_the_key(config, key) -> None:
    with pytest.raises(ConfigError, match=key):
        ServerConfig.load(config, environ={})
    with pytest.raises(ConfigError, match=key):
        ProtoServer({"jwtSecret": SECRET, **config})


def test_unknown_keys_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match="prot"):
        ServerConfig.load({"prot": 80}, environ={})
    with pytest.raises(ConfigError, match="minCredit"):
        ServerConfig.load({"flowControl": {"minCredit": 1}}, environ={})


def test_invalid_snake_case_dataclass_values() -> None:
    with pytest.raises(ConfigError, match="port"):
        ServerConfig(port=70000)
    with pytest.raises(ConfigError, match="backPressureThreshold"):
        FlowControlConfig(back_pressure_threshold=1.5)
    with pytest.raises(ConfigError, match="minCredits"):
        FlowControlConfig(min_credits=20, max_credits=10)


def test_boundary_values_are_valid() -> None:
    config = ServerConfig.load({"port": 65535, "flowControl": {
        "backPressureThreshold": 1, "minCredits": 50, "maxCredits": 50,
        "creditThreshold": 0}}, environ={})
    assert config.port == 65535
    assert config.flow_control.back_pressure_threshold == 1.0
    assert ServerConfig.load({"port": 0}, environ={}).port == 0


def test_initial_credit_messages_below_min_credits_is_valid() -> None:
    config = ServerConfig.load({"flowControl": {"initialCreditMessages": 5,
                                                "minCredits": 100}}, environ={})
    assert config.flow_control.initial_credit_messages == 5
    assert config.flow_control.min_credits == 100


@pytest.mark.parametrize("value,seconds", [
    ("30s", 30), ("15m", 900), ("24h", 86400), ("7d", 604800), ("3600", 3600), (3600, 3600),
])
def test_jwt_expires_in_accepts_durations_and_seconds(value, seconds) -> None:
    config = ServerConfig.load({"jwtSecret": "s", "jwtExpiresIn": value}, environ={})
    authority = TokenAuthority("s", config.jwt_algorithms, config.jwt_expires_in)
    assert authority.expires_in == seconds


# -- jwtSecret and development mode ---------------------------------------------------


def test_missing_jwt_secret_refuses_with_a_clear_message() -> None:
    with pytest.raises(ConfigError, match="jwtSecret is required") as info:
        ProtoServer({"port": 0})
    assert "JWT_SECRET" in str(info.value)
    with pytest.raises(ConfigError, match="jwtSecret"):
        ProtoServer(ServerConfig(port=0))


def test_jwt_secret_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JWT_SECRET", "env-secret")
    server = ProtoServer({"port": 0})
    assert server.config.jwt_secret == "env-secret"
    assert server.dev_token is None


def test_dev_mode_generates_a_secret_and_a_working_token() -> None:
    server = ProtoServer({"port": 0, "devMode": True})
    secret = server.config.jwt_secret
    assert isinstance(secret, str) and len(secret) >= 32
    assert server.dev_token
    assert server.authority.verify(server.dev_token) == "dev"
    # an independent authority with the generated secret agrees
    assert TokenAuthority(secret).verify(server.dev_token) == "dev"
    # and a second dev server gets a different random secret
    other = ProtoServer({"port": 0, "devMode": True})
    assert other.config.jwt_secret != secret


def test_dev_mode_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROTOFLASK_DEV", "1")
    server = ProtoServer({"port": 0})
    assert server.dev_token and server.authority.verify(server.dev_token) == "dev"


def test_dev_mode_keeps_an_explicit_secret() -> None:
    server = ProtoServer({"port": 0, "devMode": True, "jwtSecret": SECRET})
    assert server.config.jwt_secret == SECRET
    assert TokenAuthority(SECRET).verify(server.dev_token) == "dev"


def test_public_dict_masks_the_secret() -> None:
    out = ServerConfig(jwt_secret="hunter2").to_public_dict()
    assert out["jwtSecret"] == "***"
    assert "hunter2" not in repr(out)
    assert out["flowControl"]["initialCreditBytes"] == 1048576
