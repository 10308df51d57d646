"""Every configuration default is written once, in OPTIONS / FLOW_OPTIONS: the
dataclasses and the core's settings take theirs from there."""

from __future__ import annotations

import dataclasses

from protoflask.config import FLOW_OPTIONS, OPTIONS, FlowControlConfig, ServerConfig
from protoflask.core.credits import CreditSettings
from protoflask.core.settings import SessionSettings


def test_the_dataclasses_have_one_field_per_option_with_its_default() -> None:
    assert {f.name for f in dataclasses.fields(ServerConfig)} == \
        {o.attr for o in OPTIONS} | {"flow_control"}
    assert {f.name for f in dataclasses.fields(FlowControlConfig)} == \
        {o.attr for o in FLOW_OPTIONS}
    config = ServerConfig()
    for o in OPTIONS:
        assert getattr(config, o.attr) == o.default, o.key
    for o in FLOW_OPTIONS:
        assert getattr(config.flow_control, o.attr) == o.default, o.key


def test_the_core_settings_have_no_defaults_of_their_own() -> None:
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(CreditSettings))
    with_default = {f.name for f in dataclasses.fields(SessionSettings)
                    if f.default is not dataclasses.MISSING}
    assert with_default == {"max_pending_messages"}  # not a configuration key


def test_rate_limit_is_an_int_everywhere() -> None:
    config = ServerConfig.load({"rateLimit": 50}, environ={})
    assert type(config.rate_limit) is int
    assert type(config.session_settings().rate_limit) is int
