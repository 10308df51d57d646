"""Python's ``httpx`` with ``httpx-sse``: SSE read by httpx-sse's parser (upstream POSTs
with httpx), SSE resume by ``Last-Event-ID``, and the NDJSON stream (a one-shot HELLO
body, follow-up POSTs, a caught-up resume) read with ``iter_lines``.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from ..support import hello_payload, timeout
from .conftest import QUIET

httpx = pytest.importorskip("httpx")  # the `test` extra installs both
httpx_sse = pytest.importorskip("httpx_sse")


def envelope(seq: int, type: str, channel: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"h{seq}", "session": "", "seq": str(seq), "ts": "0", "type": type,
            "channel": channel, "payload": payload}


@pytest.fixture
def client() -> Iterator[Any]:
    with httpx.Client(timeout=httpx.Timeout(timeout(10))) as c:
        yield c


def test_httpx_sse_events_posts_and_last_event_id_resume(make_server, client):
    server = make_server(**QUIET)
    token = server.issue_token("httpx-sse")
    auth = {"Authorization": f"Bearer {token}"}
    url = f"{server.base_url}/proto/sse"
    with httpx_sse.connect_sse(client, "GET", url, headers=auth) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        events = source.iter_sse()
        first = next(events)
        assert first.event == "session" and first.id == ""
        sid = json.loads(first.data)["session"]
        post = client.post(f"{url}?session={sid}", headers=auth,
                           json=[envelope(1, "HELLO", "SYSTEM", hello_payload()),
                                 envelope(2, "TOOL_CALL", "USER", {
                                     "call_id": "x", "tool": "add",
                                     "params": {"a": 1, "b": 2}})])
        assert (post.status_code, post.json()) == (202, {"accepted": 2})
        got = [next(events) for _ in range(2)]
        assert [e.event for e in got] == ["message", "message"]
        assert [e.json()["type"] for e in got] == ["HELLO", "TOOL_DONE"]
        assert [e.id for e in got] == [f"{sid}:1", f"{sid}:2"]
        assert got[1].json()["payload"]["result"] == {"result": 3}

    # away: the app sends; httpx-sse resumes with the id of the last event it saw
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": "later", "role": "agent"}})
    with httpx_sse.connect_sse(client, "GET", url,
                               headers={**auth, "Last-Event-ID": got[-1].id}) as source:
        events = source.iter_sse()
        assert json.loads(next(events).data) == {"session": sid}
        replayed = next(events)
        assert replayed.id == f"{sid}:3" and replayed.json()["type"] == "MESSAGE_START"


def test_httpx_ndjson_stream_follow_ups_and_caught_up_resume(make_server, client):
    server = make_server(**QUIET)
    token = server.issue_token("httpx-stream")
    auth = {"Authorization": f"Bearer {token}"}
    url = f"{server.base_url}/proto/stream"
    with client.stream("POST", url, headers=auth,
                       json=envelope(1, "HELLO", "SYSTEM", hello_payload())) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        sid = resp.headers["proto-session"]
        lines = resp.iter_lines()
        assert json.loads(next(lines))["type"] == "HELLO"
        follow = client.post(f"{url}?session={sid}", headers=auth,
                             content=json.dumps(envelope(2, "PING", "SYSTEM",
                                                         {"nonce": "p"})) + "\n")
        assert (follow.status_code, follow.json()) == (202, {"accepted": 1})
        pong = json.loads(next(lines))
        assert pong["type"] == "PONG" and pong["payload"] == {"nonce": "p"}

    # a resume with nothing newer than last_seq: httpx gets its head at once
    with client.stream("POST", f"{url}?session={sid}&last_seq={pong['seq']}",
                       headers=auth, content=b"") as resp:
        assert resp.status_code == 200 and resp.headers["proto-session"] == sid
        client.post(f"{url}?session={sid}", headers=auth,
                    json=envelope(3, "PING", "SYSTEM", {"nonce": "q"}))
        again = json.loads(next(resp.iter_lines()))
        assert again["payload"] == {"nonce": "q"} and int(again["seq"]) == int(pong["seq"]) + 1
