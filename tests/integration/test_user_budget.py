"""A byte budget per user over all their sessions, live and kept (maxUserBytes), counted
by what the sessions cost in memory (issue 24, item 1).

Open texts are what a client makes the server hold most cheaply (8 × 4 MiB a session,
kept after a disconnect). With maxUserBytes of 3 MiB, each part is charged to its user
as it comes, over all their sessions (a kept one's included): the part that would take
them over is refused (ERROR MESSAGE_TOO_LARGE, the text discarded) and the session goes
on; a text of ASCII with one emoji is counted at 4 bytes a character (what the str
costs), not at its UTF-8 length; the user never holds more than the budget; a
bystander's session, also holding a text, is untouched throughout and answers. (What
the tick sheds, oldest kept session first then the heaviest, is tests/engine/test_budget.py.)
"""

from __future__ import annotations

import pytest
import requests

from ..hardening_support import Live, answers, vitals
from ..support import WSClient, timeout

MIB = 1 << 20


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, maxUserBytes=3 * MIB, replayWindowTime=60000,
                  echoMessages=False)
    try:
        yield server
    finally:
        server.stop()


def open_text(client: WSClient, mid: str, char: str) -> None:
    """A text of two parts of 1,000,000 characters (1.9 MiB), left open."""
    client.send("MESSAGE_START", "USER", {"message_id": mid, "content_type": "text/plain"})
    for _ in range(2):
        client.send("MESSAGE_PART", "USER", {"message_id": mid, "content": char * 1_000_000})
    client.send("PING", "SYSTEM", {"nonce": f"after-{mid}"})
    client.recv_type("PONG", nonce=f"after-{mid}")


def resumable(live: Live, token: str, session: str) -> bool:
    resp = requests.post(live.base_url + f"/proto/stream?session={session}&last_seq=0",
                         headers={"Authorization": f"Bearer {token}"}, data=b"",
                         timeout=timeout(10), stream=True)
    try:
        return resp.status_code == 200
    finally:
        resp.close()


def held_by(live: Live, user: str) -> int:
    return vitals(live.base_url)["heldByUser"].get(user, 0)


def test_a_part_over_the_users_budget_is_refused_and_the_bystander_keeps_everything(live):
    token, other = live.token("hoarder"), live.token("bystander")
    bystander = WSClient(live.base_url, other)
    bystander.hello()
    open_text(bystander, "b1", "b")
    kept = WSClient(live.base_url, token)
    kept.hello()
    open_text(kept, "k1", "k")
    kept.close()  # kept for resume, holding 1.9 MiB
    current = WSClient(live.base_url, token)
    try:
        current.hello()
        current.send("MESSAGE_START", "USER", {"message_id": "c1",
                                               "content_type": "text/plain"})
        current.send("MESSAGE_PART", "USER", {"message_id": "c1", "content": "c" * 1_000_000})
        current.send("MESSAGE_PART", "USER", {"message_id": "c1", "content": "c" * 1_000_000})
        error = current.recv_until(lambda m: m["type"] == "ERROR", within=timeout(10))
        assert error["payload"]["code"] == "MESSAGE_TOO_LARGE", error
        assert "maxUserBytes" in error["payload"]["message"]
        assert held_by(live, "hoarder") <= 3 * MIB
        # one emoji makes the whole part 4 bytes a character: 0.3 MB of UTF-8, 1.2 MB held
        current.send("MESSAGE_START", "USER", {"message_id": "c2",
                                               "content_type": "text/plain"})
        current.send("MESSAGE_PART", "USER", {"message_id": "c2",
                                              "content": "\U0001F600" + "x" * 299_999})
        error = current.recv_until(lambda m: m["type"] == "ERROR", within=timeout(10))
        assert error["payload"]["code"] == "MESSAGE_TOO_LARGE", error
        # the same length in ASCII is let in
        current.send("MESSAGE_START", "USER", {"message_id": "c3",
                                               "content_type": "text/plain"})
        current.send("MESSAGE_PART", "USER", {"message_id": "c3", "content": "x" * 300_000})
        current.send("PING", "SYSTEM", {"nonce": "still"})
        pong = current.recv_until(lambda m: m["type"] in ("PONG", "ERROR"), within=timeout(10))
        assert pong["type"] == "PONG", pong  # no ERROR for c3, and the session goes on
        assert held_by(live, "hoarder") <= 3 * MIB
        assert resumable(live, token, kept.session_id)  # refused new work, shed nothing
        # the bystander lost nothing and is answered
        bystander.send("PING", "SYSTEM", {"nonce": "bystander"})
        bystander.recv_type("PONG", nonce="bystander")
        bystander.send("MESSAGE_END", "USER", {"message_id": "b1"})
        answers(live.base_url, other)
        # the user is within budget: a new session is let in
        with WSClient(live.base_url, token) as again:
            again.hello()
    finally:
        current.close()
        bystander.close()
