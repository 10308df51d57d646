"""The HELLO reply's parts made once (issue 29): the capabilities per settings and
extensions, the sorted type list per set of types. Held equal to building them anew."""

from __future__ import annotations

import pytest

from protoflask.config import ServerConfig
from protoflask.core.envelope import SERVER_TYPES
from protoflask.core.hello import capabilities, capabilities_plain
from protoflask.core.messages import hello, sorted_types

CONFIGS = [{}, {"rateLimit": 0}, {"heartbeatInterval": 1234, "replayWindowSize": 7},
           {"flowControl": {"enabled": False}}, {"maxMessageSize": 4096}]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("extensions", [frozenset(), frozenset({"agui"})])
def test_capabilities_are_made_once_and_equal_to_a_fresh_build(config, extensions) -> None:
    settings = ServerConfig.load(config, environ={}).session_settings()
    made = capabilities(settings, extensions)
    assert made == capabilities_plain(settings, extensions)
    assert capabilities(settings, extensions) is made  # the template, not a new one


def test_the_last_pair_answered_is_never_another_pairs() -> None:
    """``capabilities`` answers the last pair by identity: asked in turn for settings
    and extensions that differ, each gets its own, the same object as before."""
    a, b = (ServerConfig.load(c, environ={}).session_settings() for c in CONFIGS[2:4])
    agui = frozenset({"agui"})
    first = {(s, e): capabilities(s, e) for s in (a, b) for e in (frozenset(), agui)}
    for _ in range(2):
        for s in (a, b, b, a):
            for e in (agui, frozenset(), frozenset()):
                made = capabilities(s, e)
                assert made is first[s, e] and made == capabilities_plain(s, e)


@pytest.mark.parametrize("types", [SERVER_TYPES, frozenset({"PONG", "HELLO", "ERROR"}),
                                   frozenset(), ["b", "a"], ("z", "y")])
def test_sorted_types_are_sorted(types) -> None:
    assert sorted_types(types) == sorted(types)


def test_the_hello_reply_is_the_same_as_built_anew() -> None:
    settings = ServerConfig.load({}, environ={}).session_settings()
    fresh = hello(session_id="s", accept_events=sorted(SERVER_TYPES),
                  capabilities=capabilities_plain(settings, frozenset()), last_client_seq=3)
    made = hello(session_id="s", accept_events=SERVER_TYPES,
                 capabilities=capabilities(settings, frozenset()), last_client_seq=3)
    assert made == fresh


def test_the_replys_shared_segments_are_encoded_once_per_pair() -> None:
    """The window's segments of a HELLO reply (outbound._hello_shared): the same tuple for
    every reply with the same capabilities and type list, equal to encoding them anew; a
    reply with another pair gets its own."""
    from orjson import dumps

    from protoflask.core.envelope import ENCODING
    from protoflask.core.outbound import _hello_shared
    from protoflask.core.replay import shared

    settings = ServerConfig.load({}, environ={}).session_settings()
    other = ServerConfig.load({"heartbeatInterval": 999}, environ={}).session_settings()
    for caps in (capabilities(settings, frozenset()), capabilities(other, frozenset()),
                 capabilities(settings, frozenset({"agui"}))):
        replies = [hello(session_id=f"s{i}", accept_events=SERVER_TYPES, capabilities=caps,
                         last_client_seq=i) for i in range(3)]
        got = [_hello_shared(reply) for reply in replies]
        anew = shared(dumps(caps, option=ENCODING), dumps(sorted(SERVER_TYPES),
                                                         option=ENCODING))
        assert got[0] == anew and all(g is got[0] for g in got)
    assert _hello_shared(hello(session_id="s", accept_events=["HELLO"], capabilities=caps,
                               last_client_seq=0)) == shared(
        dumps(caps, option=ENCODING), b'["HELLO"]')
