"""Node's ``ws`` and ``eventsource`` packages (tests/interop/node, pinned by its lockfile;
``npm ci`` by .ci/run, or by the test when node_modules is absent), run by pytest through
``node clients.mjs``: a WebSocket conversation and its refusal before the upgrade, and an
EventSource (Bearer header through its fetch option) whose stream the server ends and then
cuts, which must reconnect by itself with Last-Event-ID and lose nothing.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ..support import wait_for
from .conftest import NODE_DIR, QUIET, need_node

SCRIPT = str(NODE_DIR / "clients.mjs")


def parsed(line: str) -> dict[str, Any]:
    return json.loads(line)


def test_node_ws_conversation_and_refusal(make_server, processes):
    node = need_node()
    server = make_server(**QUIET)
    proc = processes([node, SCRIPT, "ws", server.base_url, server.issue_token("node-ws")],
                     cwd=NODE_DIR)
    proc.expect(lambda line: parsed(line)["kind"] == "close", what="the close")
    got = [parsed(line) for line in proc.lines]
    assert [g["msg"]["type"] for g in got if g["kind"] == "message"] == ["HELLO", "TOOL_DONE"]
    assert got[1]["msg"]["payload"]["result"] == {"result": 42}
    assert got[-1] == {"kind": "close", "code": 1000}

    refused = processes([node, SCRIPT, "ws-refused", server.base_url], cwd=NODE_DIR)
    answer = parsed(refused.expect(lambda line: parsed(line)["kind"] == "refused",
                                   what="the refusal"))
    assert answer["status"] == 401 and answer["contentType"].startswith("application/json")
    assert answer["body"]["error"]["code"] == "MISSING_TOKEN"


def _send(server: Any, sid: str, n: int) -> None:
    server.send_message(sid, {"type": "MESSAGE_START", "channel": "AGENT",
                              "payload": {"message_id": f"m{n}", "role": "agent"}})


def test_node_eventsource_reconnects_and_resumes_without_loss(make_server, processes):
    node = need_node()
    server = make_server(**QUIET)
    proc = processes([node, SCRIPT, "sse", server.base_url, server.issue_token("node-sse")],
                     cwd=NODE_DIR)

    def starts() -> list[str]:
        return [parsed(line)["msg"]["payload"]["message_id"] for line in proc.lines
                if parsed(line)["kind"] == "message"
                and parsed(line)["msg"]["type"] == "MESSAGE_START"]

    def until_starts(n: int) -> None:
        if len(starts()) < n:
            proc.expect(lambda line: len(starts()) >= n, within=20, what=f"{n} messages")

    hello = parsed(proc.expect(lambda line: parsed(line).get("msg", {}).get("type") == "HELLO",
                               what="the HELLO reply"))
    sid = hello["msg"]["session"]
    sent = 0
    for _ in range(3):
        sent += 1
        _send(server, sid, sent)
    until_starts(sent)

    server.close_all_connections()  # the server ends the response
    wait_for(lambda: not server.get_session(sid)["connected"], what="the stream ended")
    for _ in range(4):
        sent += 1
        _send(server, sid, sent)
    until_starts(sent)

    server.get_session(sid)["sseResponse"].sock.shutdown(socket.SHUT_RDWR)  # cut under it
    for _ in range(4):
        sent += 1
        _send(server, sid, sent)
    until_starts(sent)

    got = [parsed(line) for line in proc.lines]
    messages = [g for g in got if g["kind"] == "message"]
    seqs = [int(m["msg"]["seq"]) for m in messages]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert all(m["id"] == f"{sid}:{m['msg']['seq']}" for m in messages)
    assert starts() == [f"m{n}" for n in range(1, sent + 1)]
    sessions = [g["sid"] for g in got if g["kind"] == "session"]
    assert len(sessions) >= 3 and set(sessions) == {sid}
    assert sum(1 for g in got if g["kind"] == "open") >= 3
