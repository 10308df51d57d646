"""The per-user connection cap's default cannot be taken by a handful of users (issue
24): under the default maxConnectionsPerUser (a tenth of maxConnections), the last tenth
of the slots is kept for users holding fewer than a hundredth of them."""

from __future__ import annotations

import pytest

from protoflask.config import ServerConfig
from protoflask.core.errors import UserConnectionLimit
from protoflask.limits import user_caps

SECRET = "test-secret-that-is-long-enough-for-hs256!"


def caps(**config):
    return user_caps(ServerConfig.load({"jwtSecret": SECRET, **config}, environ={}))


def test_ten_heavy_users_leave_the_last_tenth_to_light_users():
    c = caps(maxConnections=1000)
    assert c.cap == 100
    taken = 0
    for user in range(10):  # ten users each try to take their whole cap
        for _ in range(100):
            try:
                c.take_connection(f"heavy{user}")
            except UserConnectionLimit:
                break
            taken += 1
    # nine at their cap; the tenth stops once it holds a hundredth of the slots
    assert taken == 910
    # ninety light users get the rest
    for user in range(90):
        c.take_connection(f"light{user}")
    with pytest.raises(UserConnectionLimit):
        c.take_connection("heavy0")
    # a heavy user's resume still replaces its own transport
    c.take_connection("heavy0", replacing=True)
    c.release_connection("heavy0")
    for user in range(50):
        c.release_connection(f"light{user}")
    assert c.free == 50


def test_a_cap_the_operator_sets_has_no_reserve():
    c = caps(maxConnections=1000, maxConnectionsPerUser=500)
    for _ in range(500):
        c.take_connection("a")
    for _ in range(500):
        c.take_connection("b")
    with pytest.raises(UserConnectionLimit):
        c.take_connection("a")
