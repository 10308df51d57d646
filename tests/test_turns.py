"""turns.py: a real turn for the others, and the pause a user's costly turns owe."""

from __future__ import annotations

import gevent

from protoflask.turns import COSTLY, FORGET_PAST, Pacer, give_turn


def test_give_turn_lets_a_greenlet_run_that_sleep_0_would_not():
    """gevent.sleep(0) in a loop runs again before the loop polls (here: before a
    timer that is due); give_turn waits for it."""
    ran: list[str] = []
    gevent.spawn_later(0, ran.append, "timer")
    for _ in range(10):
        gevent.sleep(0)
    assert ran == []
    give_turn()
    assert ran == ["timer"]


def test_a_costly_turn_pauses_its_user_and_nobody_else():
    pacer = Pacer()
    order: list[str] = []

    def flooder() -> None:
        pacer.took("flooder", COSTLY * 3)  # paused for as long
        order.append("flooder again")

    def flooders_other_connection() -> None:
        pacer.pause("flooder")
        order.append("flooder's other connection")

    def bystander() -> None:
        pacer.pause("bystander")
        order.append("bystander")

    first = gevent.spawn(flooder)
    gevent.sleep(0)  # the flooder's turn has taken place: it owes
    assert "flooder" in pacer.owed
    gevent.joinall([first, gevent.spawn(flooders_other_connection), gevent.spawn(bystander)])
    assert order[0] == "bystander"
    assert set(order[1:]) == {"flooder again", "flooder's other connection"}
    assert pacer.owed == {}  # paid: forgotten


def test_a_cheap_turn_owes_nothing():
    pacer = Pacer()
    pacer.took("user", COSTLY / 10)
    assert pacer.owed == {}


def test_a_cheap_turn_of_a_user_who_owes_waits_with_the_others():
    """Another connection of a user paying for a costly turn pauses at the end of even
    a cheap turn of its own (a stream's pieces, a body's slices): no way around the
    pause by spreading the flood over connections."""
    pacer = Pacer()
    order: list[str] = []

    def costly() -> None:
        pacer.took("flooder", COSTLY * 3)
        order.append("costly")

    def cheap_of_the_same_user() -> None:
        pacer.took("flooder", 0.0)
        order.append("cheap, same user")

    def cheap_of_another() -> None:
        pacer.took("bystander", 0.0)
        order.append("bystander")

    first = gevent.spawn(costly)
    gevent.sleep(0)
    gevent.joinall([first, gevent.spawn(cheap_of_the_same_user),
                    gevent.spawn(cheap_of_another)])
    assert order[0] == "bystander"
    assert set(order[1:]) == {"costly", "cheap, same user"}


def test_users_paid_up_are_forgotten():
    pacer = Pacer()
    for user in range(FORGET_PAST):
        pacer.owed[f"gone{user}"] = 0.0  # paid long ago, never came back to pause
    pacer.took("flooder", COSTLY)
    assert pacer.owed == {}  # the flooder paid its own pause; the rest forgotten
