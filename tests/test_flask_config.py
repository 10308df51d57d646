"""Configuration the Flask way: PROTOFLASK_* keys in app.config (explicit arguments >
app.config > environment > defaults), and the one generated table in the README."""

from __future__ import annotations

import re

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flask import Flask

from protoflask import ConfigError, ProtoServer, ServerConfig
from protoflask.config import FLOW_OPTIONS, OPTIONS, app_config_key, options_table

from .support import ROOT, SECRET

# a non-default value per option, as app.config would hold it
OTHER = {
    "port": 9090, "host": "127.0.0.1", "jwtSecret": "from-app", "jwtExpiresIn": "15m",
    "jwtAlgorithms": ["HS512"], "maxConnections": 7, "heartbeatInterval": 1500,
    "heartbeatTimeout": 700, "maxConcurrentRuns": 3, "toolQueueSize": 4,
    "toolTimeout": 900, "replayWindowSize": 50, "replayWindowTime": 2500,
    "maxMessageSize": 4096, "outboundBufferSize": 65536, "echoMessages": False,
    "enableCORS": False, "enableCompression": False, "enableLogging": False,
    "nodeEnv": "development", "devMode": True, "redisUrl": "redis://127.0.0.1:6379/15",
    "redisSentinels": ["sentinel.internal:26379"], "redisSentinelMaster": "pf",
    "redisPrefix": "from-app", "metrics": False, "dashboard": False,
    "maxJsonDepth": 16, "rateLimit": 50,
    "rateLimitBurst": 10, "allowedOrigins": ["https://app.example.com"], "debugVitals": True,
    "operatorToken": "an-operator-credential",
    "jwtPublicKey": ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
    "jwksUrl": "https://idp.example.com/.well-known/jwks.json", "jwksRefreshInterval": 5000,
    "jwtAudience": "my-app", "jwtIssuer": "https://idp.example.com/",
    "maxConnectionsPerUser": 3, "maxKeptSessionsPerUser": 2, "bodyTimeout": 1500,
    "jwtRequireExp": False,
    "replayWindowBytes": 65536, "maxOpenTexts": 2, "maxTextSize": 10000,
    "maxUserBytes": 1 << 27, "memoryCeiling": 1 << 29,
}
FLOW_OTHER = {
    "enabled": False, "initialCredits": 300, "minCredits": 20, "maxCredits": 500,
    "creditThreshold": 0, "backPressureThreshold": 0.5, "adaptiveAdjustment": False,
    "initialCreditMessages": 5, "initialCreditBytes": 2048,
}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for opt in (*OPTIONS, *FLOW_OPTIONS):
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)


def normal(value):
    return tuple(value) if isinstance(value, list) else value


def test_every_option_has_an_app_config_key() -> None:
    assert set(OTHER) == {o.key for o in OPTIONS}
    assert set(FLOW_OTHER) == {o.key for o in FLOW_OPTIONS}
    by_key = {o.key: o for o in OPTIONS}
    assert app_config_key(by_key["maxConnections"]) == "PROTOFLASK_MAX_CONNECTIONS"
    assert app_config_key(FLOW_OPTIONS[2], True) == "PROTOFLASK_FLOW_CONTROL_MIN_CREDITS"


@pytest.mark.parametrize("opt", OPTIONS, ids=[o.key for o in OPTIONS])
def test_each_top_level_option_from_app_config(opt) -> None:
    key = "PROTOFLASK_" + opt.attr.upper()
    config = ServerConfig.load({}, environ={}, app_config={key: OTHER[opt.key]})
    assert getattr(config, opt.attr) == normal(OTHER[opt.key])
    assert getattr(config, opt.attr) != opt.default


@pytest.mark.parametrize("opt", FLOW_OPTIONS, ids=[o.key for o in FLOW_OPTIONS])
def test_each_flow_option_from_app_config(opt) -> None:
    key = "PROTOFLASK_FLOW_CONTROL_" + opt.attr.upper()
    value = FLOW_OTHER[opt.key]
    limits = {"PROTOFLASK_FLOW_CONTROL_MIN_CREDITS": 1} if opt.key == "maxCredits" else {}
    config = ServerConfig.load({}, environ={}, app_config={key: value, **limits})
    assert getattr(config.flow_control, opt.attr) == value != opt.default
    # the same through the one-dict form
    config = ServerConfig.load({}, environ={}, app_config={
        "PROTOFLASK_FLOW_CONTROL": {opt.key: value, **({"minCredits": 1} if limits else {})}})
    assert getattr(config.flow_control, opt.attr) == value


def test_precedence_explicit_then_app_config_then_env_then_default() -> None:
    env = {"MAX_CONNECTIONS": "5", "HEARTBEAT_INTERVAL": "2000",
           "FLOW_CONTROL_MIN_CREDITS": "30", "FLOW_CONTROL_MAX_CREDITS": "900"}
    app_config = {"PROTOFLASK_MAX_CONNECTIONS": 6, "PROTOFLASK_REPLAY_WINDOW_SIZE": 70,
                  "PROTOFLASK_HEARTBEAT_INTERVAL": 3000,
                  "PROTOFLASK_FLOW_CONTROL": {"minCredits": 40, "creditThreshold": 10}}
    explicit = {"maxConnections": 7, "flowControl": {"creditThreshold": 11}}
    config = ServerConfig.load(explicit, environ=env, app_config=app_config)
    assert config.max_connections == 7  # explicit beats app.config and env
    assert config.heartbeat_interval == 3000  # app.config beats env
    assert config.replay_window_size == 70  # app.config beats the default
    assert config.heartbeat_timeout == 5000  # default
    fc = config.flow_control
    assert (fc.credit_threshold, fc.min_credits, fc.max_credits, fc.initial_credits) == \
        (11, 40, 900, 1000)  # explicit, app.config, env, default
    # a ServerConfig is complete: taken as is
    given = ServerConfig(jwt_secret="s", max_connections=9)
    assert ServerConfig.load(given, environ=env, app_config=app_config) is given


def test_none_counts_as_not_set_and_other_keys_are_ignored() -> None:
    config = ServerConfig.load({}, environ={"PORT": "1234"}, app_config={
        "PROTOFLASK_PORT": None, "PROTOFLASK_FLOW_CONTROL": None, "DEBUG": True,
        "SECRET_KEY": "flask's own", "PROTOFLASK_JWT_SECRET": None})
    assert config.port == 1234 and config.jwt_secret is None


@pytest.mark.parametrize("app_config,message", [
    ({"PROTOFLASK_MAX_CONECTIONS": 3}, "did you mean PROTOFLASK_MAX_CONNECTIONS"),
    ({"PROTOFLASK_DEV": True}, "did you mean PROTOFLASK_DEV_MODE"),  # the env var's name
    ({"PROTOFLASK_MAX_CONNECTIONS": "many"},
     r"maxConnections \(app.config PROTOFLASK_MAX_CONNECTIONS\) must be an integer"),
    ({"PROTOFLASK_ECHO_MESSAGES": "no"}, "PROTOFLASK_ECHO_MESSAGES.*boolean"),
    ({"PROTOFLASK_FLOW_CONTROL_MIN_CREDITS": 0},
     r"flowControl.minCredits \(app.config PROTOFLASK_FLOW_CONTROL_MIN_CREDITS\) must be >= 1"),
    ({"PROTOFLASK_FLOW_CONTROL": {"minCredit": 1}}, "unknown app.config PROTOFLASK_FLOW_CONTROL"),
    ({"PROTOFLASK_FLOW_CONTROL": 5}, "must be a dict"),
    ({"PROTOFLASK_FLOW_CONTROL": {"minCredits": 5}, "PROTOFLASK_FLOW_CONTROL_MIN_CREDITS": 6},
     "set twice"),
])
def test_bad_app_config_names_the_key(app_config, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerConfig.load({}, environ={}, app_config=app_config)


def app_with(**config) -> Flask:
    app = Flask("configured")
    app.config.update(config)
    return app


def test_protoserver_with_an_app_reads_its_config() -> None:
    app = app_with(PROTOFLASK_JWT_SECRET=SECRET, PROTOFLASK_MAX_CONCURRENT_RUNS=3,
                   PROTOFLASK_FLOW_CONTROL_INITIAL_CREDIT_MESSAGES=5)
    server = ProtoServer(app=app)  # the secret comes from app.config
    assert server.config.jwt_secret == SECRET
    assert server.config.max_concurrent_runs == 3
    assert server.engine.settings.max_concurrent_runs == 3  # what sessions will use
    assert server.engine.settings.credits.initial_credit_messages == 5
    assert server.authority.verify(server.issue_token("u")) == "u"
    explicit = ProtoServer({"jwtSecret": SECRET, "maxConcurrentRuns": 8},
                           app=app_with(PROTOFLASK_MAX_CONCURRENT_RUNS=3))
    assert explicit.config.max_concurrent_runs == 8
    with pytest.raises(ConfigError, match="PROTOFLASK_JWT_SECRET"):
        ProtoServer(app=app_with())  # the missing-secret message names the app.config key


def test_init_app_later_rederives_from_the_first_app() -> None:
    server = ProtoServer({"jwtSecret": SECRET})
    assert server.config.max_concurrent_runs == 10
    engine_before = server.engine
    app = app_with(PROTOFLASK_MAX_CONCURRENT_RUNS=2, PROTOFLASK_ECHO_MESSAGES=False)
    server.init_app(app)
    assert server.config.max_concurrent_runs == 2 and not server.config.echo_messages
    assert server.engine is not engine_before
    assert server.engine.settings.max_concurrent_runs == 2
    assert server.engine.settings.echo_messages is False
    assert server.config.jwt_secret == SECRET  # explicit arguments still win


def test_init_app_without_protoflask_keys_keeps_the_server_as_it_is() -> None:
    server = ProtoServer({"devMode": True})
    token, engine = server.dev_token, server.engine
    server.init_app(Flask("plain"))
    assert server.dev_token == token and server.engine is engine  # same random secret


def test_a_second_app_may_not_change_the_config() -> None:
    server = ProtoServer({"jwtSecret": SECRET}, app=app_with(PROTOFLASK_MAX_CONNECTIONS=50))
    server.init_app(app_with(PROTOFLASK_MAX_CONNECTIONS=50))  # the same: fine
    other = app_with(PROTOFLASK_MAX_CONNECTIONS=60)
    with pytest.raises(ConfigError, match="would change maxConnections"):
        server.init_app(other)
    assert "protoflask" not in other.extensions
    assert server.config.max_connections == 50
    with pytest.raises(ConfigError, match=r"would change flowControl.minCredits of"):
        server.init_app(app_with(PROTOFLASK_FLOW_CONTROL={"minCredits": 5},
                                 PROTOFLASK_MAX_CONNECTIONS=50))


def test_the_readme_table_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == options_table(), (
        "README.md's configuration table is out of date: replace it with the output of "
        "python -c 'from protoflask.config import options_table; print(options_table())'")
    assert re.search(r"\| maxConnections \| PROTOFLASK_MAX_CONNECTIONS \| MAX_CONNECTIONS \|",
                     table)
