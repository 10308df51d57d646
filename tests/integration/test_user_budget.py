"""A byte budget per user over all their sessions, live and kept (maxUserBytes), counted
by what the sessions cost in memory (issue 24, item 1).

Open texts are what a client makes the server hold most cheaply (8 × 4 MiB a session,
kept after a disconnect). With maxUserBytes of 3 MiB: a user's kept session goes first
when their live one pushes them over, then the heaviest live one is closed (ERROR
MESSAGE_TOO_LARGE, 1009); a text of ASCII with one emoji is counted at 4 bytes a
character (what the str costs), not at its UTF-8 length; a bystander's session, also
holding a text, is untouched throughout and answers.
"""

from __future__ import annotations

import pytest
import requests

from ..hardening_support import Live, answers
from ..support import WSClient, timeout, wait_for

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


def test_the_oldest_kept_session_goes_first_then_the_heaviest(live):
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
        open_text(current, "c1", "c")  # the user now holds 3.8 MiB
        wait_for(lambda: not resumable(live, token, kept.session_id), within=timeout(10),
                 what="the user's kept session to be dropped")
        current.send("PING", "SYSTEM", {"nonce": "still"})
        current.recv_type("PONG", nonce="still")  # the live one stays: 1.9 MiB is within
        # one emoji makes the whole part 4 bytes a character: 0.9 MB of UTF-8, 3.6 MB held
        current.send("MESSAGE_START", "USER", {"message_id": "c2",
                                               "content_type": "text/plain"})
        current.send("MESSAGE_PART", "USER", {"message_id": "c2",
                                              "content": "\U0001F600" + "x" * 900_000})
        error = current.recv_until(lambda m: m["type"] == "ERROR", within=timeout(10))
        assert error["payload"]["code"] == "MESSAGE_TOO_LARGE", error
        wait_for(lambda: not current.is_open(), within=timeout(10),
                 what="the heaviest session to be closed")
        assert current.close_code == 1009
        assert not resumable(live, token, current.session_id)
        # the bystander lost nothing and is answered
        bystander.send("PING", "SYSTEM", {"nonce": "bystander"})
        bystander.recv_type("PONG", nonce="bystander")
        bystander.send("MESSAGE_END", "USER", {"message_id": "b1"})
        answers(live.base_url, other)
        # the user is under budget again: a new session is let in
        with WSClient(live.base_url, token) as again:
            again.hello()
    finally:
        current.close()
        bystander.close()
