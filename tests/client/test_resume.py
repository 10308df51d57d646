"""Resume after a forced drop, on every transport: every server message reaches the
application exactly once and in order, and upstream messages sent around the drop are
processed exactly once."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from protoflask.client import Client, ClientTimeout, ConnectionRefused

from ..support import timeout, wait_for
from .test_client import agent_text


class HeldClient(Client):
    """Reconnects only once the test releases it, so the server is seen to notice the
    drop and to keep sending while the client is away."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def _reconnect(self) -> None:
        self.release.wait(timeout(10))
        super()._reconnect()


def held(server, transport: str, **options: Any) -> HeldClient:
    return HeldClient(server.base_url, server.issue_token("alice"), transport=transport,
                      timeout=timeout(5), **options)


def server_texts(server) -> list[str]:
    """Texts the server received, in order (the textMessage event at END)."""
    texts: list[str] = []
    server.on("textMessage", lambda sid, m: texts.append(m["payload"]["text"])
              if m["type"] == "MESSAGE_END" else None)
    return texts


def assert_contiguous(seqs: list[int]) -> None:
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "lost or duplicated seqs"


def test_resume_after_a_drop_delivers_everything_once(make_server, transport):
    server = make_server()
    got_up = server_texts(server)
    seqs: list[int] = []
    client = held(server, transport, on_message=lambda m: seqs.append(int(m["seq"])))
    try:
        client.connect()
        sid = client.session_id
        for i in range(5):
            agent_text(server, sid, f"a{i}", [f"t{i}"])
        assert [client.next_text(timeout(5)).text for _ in range(5)] == \
            [f"t{i}" for i in range(5)]

        client.drop_connection()
        wait_for(lambda: not server.get_session(sid)["connected"], what="the server to notice")
        for i in range(5, 30):  # into the replay window: nobody is connected
            agent_text(server, sid, f"a{i}", [f"t{i}", "!"])
        client.send_text("sent during the drop")
        client.release.set()

        texts = [client.next_text(timeout(10)).text for _ in range(26)]
        assert [t for t in texts if t.startswith("t")] == [f"t{i}!" for i in range(5, 30)]
        assert texts.count("sent during the drop") == 1
        assert client.reconnects == 1
        with pytest.raises(ClientTimeout):  # and nothing twice
            client.next_text(0.2)
        assert got_up == ["sent during the drop"]
        assert_contiguous(seqs)
        assert server.get_session(sid)["connected"]
    finally:
        client.release.set()
        client.close(flush_timeout=1)


def test_upstream_in_flight_at_a_drop_is_processed_once(make_server, transport):
    server = make_server()
    got_up = server_texts(server)
    client = held(server, transport)
    try:
        client.connect()
        sent = [f"up {n}" for n in range(60)]
        for text in sent[:30]:
            client.send_text(text)
        client.drop_connection()  # some of these are on the wire, some still queued
        for text in sent[30:]:
            client.send_text(text)
        client.release.set()
        wait_for(lambda: len(got_up) >= 60, within=10, what="all 60 texts at the server")
        replies = [client.next_text(timeout(10)).text for _ in range(60)]
        assert got_up == sent
        assert replies == sent
        with pytest.raises(ClientTimeout):
            client.next_text(0.2)
    finally:
        client.release.set()
        client.close(flush_timeout=1)


def test_drops_while_the_server_streams(make_server, connect_client):
    """The server keeps sending from another thread while the connection is dropped
    twice: the application still sees every text once, in order."""
    server = make_server()
    seqs: list[int] = []
    client = connect_client(server, on_message=lambda m: seqs.append(int(m["seq"])))
    sid = client.session_id
    total = 150

    def stream() -> None:
        for i in range(total):
            agent_text(server, sid, f"s{i}", [f"s{i}"])

    sender = threading.Thread(target=stream)
    sender.start()
    texts = []
    for i in range(total):
        if i in (20, 80):
            client.drop_connection()
        texts.append(client.next_text(timeout(10)).text)
    sender.join(timeout(10))
    assert texts == [f"s{i}" for i in range(total)]
    assert client.reconnects >= 1
    assert_contiguous(seqs)


def test_an_expired_session_is_reported(make_server, transport):
    server = make_server(replayWindowTime=100)
    client = held(server, transport)
    try:
        client.connect()
        sid = client.session_id
        client.drop_connection()
        wait_for(lambda: server.get_session(sid) is None, within=10,
                 what="the server to drop the expired session")
        client.release.set()
        with pytest.raises(ConnectionRefused) as lost:
            client.next_text(timeout(10))
        assert (lost.value.status, lost.value.code) == (404, "SESSION_NOT_FOUND")
        with pytest.raises(ConnectionRefused):
            client.send_text("too late")
    finally:
        client.release.set()
        client.close(flush_timeout=1)
