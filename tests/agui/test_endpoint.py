"""/proto/agui over raw HTTP: AG-UI's framing byte for byte, the errors before any event,
CORS, and the protoflask extensions (ids, re-attach exactly once, stop, a disconnect that
does not cancel); every event validated by ag-ui-protocol's models."""

from __future__ import annotations

from typing import Any

import json

import requests

from protoflask.agui.input import thread_session_id

from ..support import wait_for
from .conftest import validate


def body(thread: str, run: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "tools": [], "context": [], "state": {},
            "forwardedProps": {}, "messages": [{"id": f"m-{run}", "role": "user",
                                                "content": text}], **extra}


def blocks(raw: bytes) -> list[tuple[int | None, dict[str, Any]]]:
    """(id, event) per SSE event, checking AG-UI's framing: LF only, one data: line."""
    assert b"\r" not in raw
    out = []
    for block in raw.decode().split("\n\n"):
        if not block or block.startswith(":"):
            continue
        lines = block.split("\n")
        ids = [int(line[4:]) for line in lines if line.startswith("id: ")]
        data = [line[6:] for line in lines if line.startswith("data: ")]
        assert len(data) == 1 and len(lines) == len(ids) + 1, block
        event = json.loads(data[0])
        validate(event)
        out.append((ids[0] if ids else None, event))
    return out


def run_raw(server: Any, token: str, thread: str, run: str, text: str,
            **extra: Any) -> requests.Response:
    return requests.post(f"{server.base_url}/proto/agui", json=body(thread, run, text, **extra),
                         headers={"Authorization": f"Bearer {token}",
                                  "Accept": "text/event-stream"}, timeout=20)


def test_a_run_is_one_sse_stream_with_ids(agui_server):
    token = agui_server.issue_token("u")
    r = run_raw(agui_server, token, "t1", "r1", "state")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    got = blocks(r.content)
    assert [e["type"] for _, e in got] == ["RUN_STARTED", "STATE_SNAPSHOT", "STATE_DELTA",
                                           "RUN_FINISHED"]
    ids = [i for i, _ in got]
    assert all(i is not None for i in ids) and ids == sorted(ids) and len(set(ids)) == 4
    assert got[1][1]["snapshot"] == {"count": 1}
    assert got[2][1]["delta"] == [{"op": "replace", "path": "/count", "value": 2}]
    # the next run on the thread continues the same session's seqs
    again = blocks(run_raw(agui_server, token, "t1", "r2", "hi").content)
    assert again[0][0] > ids[-1]


def test_rejected_input_is_an_http_error_before_any_event(agui_server):
    token = agui_server.issue_token("u")
    url = f"{agui_server.base_url}/proto/agui"
    auth = {"Authorization": f"Bearer {token}"}
    r = requests.post(url, json=body("t", "r", "x"), timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "MISSING_TOKEN"
    r = requests.post(url, json=body("t", "r", "x"),
                      headers={"Authorization": "Bearer nope"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "INVALID_TOKEN"
    for bad, field in (({"runId": "r", "messages": []}, "threadId"),
                       ({"threadId": "t", "messages": []}, "runId"),
                       ({"threadId": "t", "runId": "r"}, "messages"),
                       ({"threadId": "t", "runId": "r", "messages": [{"content": "x"}]},
                        "messages[0].role"),
                       ({"threadId": "t", "runId": "r", "messages": [], "tools": [{}]},
                        "tools[0].name")):
        r = requests.post(url, json=bad, headers=auth, timeout=10)
        assert r.status_code == 400, bad
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.json()["error"]["code"] == "INVALID_MESSAGE"
        assert field in r.json()["error"]["message"]
    r = requests.post(url, data=b"not json", headers=auth, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_MESSAGE"


def test_a_second_run_while_one_is_active_is_refused(agui_server):
    token = agui_server.issue_token("u")
    url = f"{agui_server.base_url}/proto/agui"
    auth = {"Authorization": f"Bearer {token}"}
    with requests.post(url, json=body("busy", "r1", "slow"), headers=auth, stream=True,
                       timeout=20) as first:
        lines = first.iter_lines()
        assert next(lines).startswith(b"id: ")
        r = requests.post(url, json=body("busy", "r2", "hi"), headers=auth, timeout=10)
        assert r.status_code == 400 and "active run 'r1'" in r.json()["error"]["message"]
        rest = b"\n".join(lines)
    assert b'"RUN_FINISHED"' in rest


def test_cors_preflight(agui_server):
    r = requests.options(f"{agui_server.base_url}/proto/agui", timeout=10, headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
    assert "Last-Event-ID" in r.headers["Access-Control-Allow-Headers"]


def reattach(server: Any, token: str, thread: str, run: str,
             last: int | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if last is not None:
        headers["Last-Event-ID"] = str(last)
    return requests.get(f"{server.base_url}/proto/agui", params={"thread": thread, "run": run},
                        headers=headers, timeout=20)


def test_disconnect_does_not_cancel_and_reattach_delivers_the_rest_once(agui_server):
    token = agui_server.issue_token("u")
    url = f"{agui_server.base_url}/proto/agui"
    seen: list[tuple[int | None, dict[str, Any]]] = []
    with requests.post(url, json=body("cut", "r1", "slow"), stream=True, timeout=20,
                       headers={"Authorization": f"Bearer {token}"}) as r:
        buffer = b""
        for chunk in r.iter_content(None):
            buffer += chunk
            if buffer.count(b"\n\n") >= 4:
                break
    seen = blocks(b"".join(block + b"\n\n" for block in buffer.split(b"\n\n")[:4]))
    last = seen[-1][0]
    assert last is not None
    # the run goes on without a client: it finishes (not cancelled)
    session = thread_session_id("u", "cut")
    wait_for(lambda: not agui_server.get_session(session)["activeRuns"], within=20,
             what="the run's end")
    assert agui_server.get_session(session)["connected"] is False
    rest = blocks(reattach(agui_server, token, "cut", "r1", last).content)
    prelude = [e for i, e in rest if i is None]
    assert [e["type"] for e in prelude] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
    ids = [i for i, _ in rest if i is not None]
    assert ids and min(ids) == last + 1 and ids == sorted(set(ids))
    assert rest[-1][1]["type"] == "RUN_FINISHED" and "outcome" not in rest[-1][1]
    # the whole run, after its end, from the start: the same events with the same ids
    whole = blocks(reattach(agui_server, token, "cut", "r1").content)
    assert [i for i, _ in whole if i is not None][:4] == [i for i, _ in seen]
    assert [(i, e) for i, e in whole if i is not None and i > last] == \
        [(i, e) for i, e in rest if i is not None]
    assert all(i is not None for i, _ in whole)  # from the start: no prelude


def test_reattach_errors(agui_server):
    token = agui_server.issue_token("u")
    r = reattach(agui_server, token, "never", "r1")
    assert r.status_code == 404 and r.json()["error"]["code"] == "SESSION_NOT_FOUND"
    blocks(run_raw(agui_server, token, "t", "r1", "hi").content)
    r = reattach(agui_server, token, "t", "other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "RUN_NOT_FOUND"
    r = reattach(agui_server, token, "t", "r1", last=None)
    assert r.status_code == 200
    r = requests.get(f"{agui_server.base_url}/proto/agui", params={"thread": "t", "run": "r1"},
                     headers={"Authorization": f"Bearer {token}", "Last-Event-ID": "x:1"},
                     timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_MESSAGE"
    # another user's thread of the same name is not theirs
    r = reattach(agui_server, agui_server.issue_token("someone-else"), "t", "r1")
    assert r.status_code == 404


def test_stop_errors(agui_server):
    token = agui_server.issue_token("u")
    url = f"{agui_server.base_url}/proto/agui/stop"
    auth = {"Authorization": f"Bearer {token}"}
    r = requests.post(url, json={"threadId": "t"}, headers=auth, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_MESSAGE"
    blocks(run_raw(agui_server, token, "t", "r1", "hi").content)
    r = requests.post(url, json={"threadId": "t", "runId": "r1"}, headers=auth, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "RUN_NOT_FOUND"
    r = requests.post(url, json={"threadId": "t", "runId": "r1"}, timeout=10)
    assert r.status_code == 401


def test_a_stop_ends_the_handlers_stream_text_at_its_next_chunk(make_server):
    """POST /proto/agui/stop while the handler streams: its ``stream_text`` stops within
    one chunk (``StreamedText.stopped`` says why: the run was cancelled), it does not
    go on streaming into a run that has ended."""
    from .conftest import slow_chunks

    server = make_server()
    streamed: list[Any] = []

    @server.agui_handler
    def handle(run: Any) -> None:
        streamed.append(run.stream_text(slow_chunks(60, 0.05), max_delay_ms=0))

    token = server.issue_token("u")
    auth = {"Authorization": f"Bearer {token}"}
    with requests.post(f"{server.base_url}/proto/agui", json=body("stopped", "r1", "go"),
                       stream=True, timeout=20, headers=auth) as r:
        buffer = b""
        chunks = r.iter_content(None)
        while buffer.count(b'"TEXT_MESSAGE_CONTENT"') < 2:
            buffer += next(chunks)
        stop = requests.post(f"{server.base_url}/proto/agui/stop", headers=auth, timeout=10,
                             json={"threadId": "stopped", "runId": "r1"})
        assert stop.status_code == 200
        buffer += b"".join(chunks)
    got = blocks(buffer)
    assert got[-1][1]["type"] == "RUN_FINISHED"
    assert got[-1][1]["outcome"] == {"type": "cancelled"}
    sent = wait_for(lambda: streamed, within=10, what="the handler's end")[0]
    assert sent.stopped == "run_cancelled"
    contents = [e for _, e in got if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert len(contents) <= sent.parts <= len(contents) + 1


def test_the_stream_answers_the_heartbeat_for_its_client(make_server):
    """A run longer than several heartbeats: the stream answers each PING (AG-UI clients
    know nothing of them), so the heartbeat never closes it, and no PING reaches the
    client."""
    from .conftest import agent_handler, weather_tool

    server = make_server(heartbeatInterval=60, heartbeatTimeout=200)
    weather_tool(server)
    server.agui_handler(agent_handler(server))
    token = server.issue_token("u")
    got = blocks(run_raw(server, token, "hb", "r1", "slow").content)  # about 0.7 s
    assert got[-1][1]["type"] == "RUN_FINISHED" and "outcome" not in got[-1][1]
    assert [e["delta"] for _, e in got if e["type"] == "TEXT_MESSAGE_CONTENT"][:12] == \
        [f"chunk{i} " for i in range(12)]
    window = server.get_session(thread_session_id("u", "hb"))["replayWindow"]
    pings = [m for m in window.values() if b'"type":"PING"' in (
        m if isinstance(m, bytes) else json.dumps(m, separators=(",", ":")).encode())]
    assert len(pings) >= 3  # the session did ping, and the stream answered every one
