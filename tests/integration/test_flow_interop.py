"""Flow control with clients that protoflask did not write (docs/PROTOCOL.md §5
Flow control and §2.2 Sequence numbers), over every transport:

- downstream credit is counted only for a client whose HELLO asks for it
  (``capabilities.flow_control.downstream: true``); one that merely announces
  ``initial_credit_messages`` and never sends FLOW_UPDATE is never stalled;
- upstream messages that arrive out of seq order (concurrent POSTs) are all processed;
  only a seq already seen is a retransmission.
"""

from __future__ import annotations



import random
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
import requests

from ..support import SSEClient, StreamClient, timeout, wait_for


def call(client, call_id: str) -> dict:
    return client.send("TOOL_CALL", payload={"call_id": call_id, "tool": "echo",
                                             "params": {"message": call_id}})


def test_a_client_that_announces_credit_but_never_grants_is_not_stalled(
        server, token, make_client):
    # The reference SDK of the protocol: initial_credit_messages 10, no FLOW_UPDATE ever.
    # Before downstream credit was opt-in this stopped at the 10th AGENT message.
    client = make_client(server, token)
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 10}})
    for n in range(2000):
        call(client, f"c{n}")
        done = client.recv_type("TOOL_DONE", within=10)
        assert done["payload"] == {"call_id": f"c{n}", "status": "OK",
                                   "result": {"echoed": f"c{n}"}}
    assert not [m for m in client.received if m["type"] == "ERROR"]
    assert server.get_session(client.session_id)["downstreamCredits"] == {}


def test_a_client_that_asks_for_downstream_credit_is_still_gated(server, token, make_client):
    client = make_client(server, token)
    client.hello(capabilities={"flow_control": {"initial_credit_messages": 3,
                                                "downstream": True}})
    for n in range(5):
        call(client, f"c{n}")
    done = [client.recv_type("TOOL_DONE")["payload"]["call_id"] for _ in range(3)]
    assert done == ["c0", "c1", "c2"]
    # the other two are done at the server, and wait there for credit
    wait_for(lambda: len(server.get_session(client.session_id)["pendingMessages"]) == 2,
             what="two TOOL_DONEs held for want of credit")
    client.send("PING", "SYSTEM", {"nonce": "barrier"})
    client.recv_type("PONG", nonce="barrier")
    assert [m for m in client.received if m["type"] == "TOOL_DONE"][3:] == []
    assert server.get_session(client.session_id)["downstreamCredits"]["AGENT"] == 0
    client.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 2})
    assert [client.recv_type("TOOL_DONE")["payload"]["call_id"] for _ in range(2)] == [
        "c3", "c4"]


@pytest.mark.parametrize("transport,path", [("sse", "/proto/sse"), ("stream", "/proto/stream")])
def test_concurrent_posts_in_shuffled_order_all_complete_once(server, token, transport, path):
    # A browser page POSTing 50 tool calls without waiting for each answer lost 12 to 28
    # of them in silence: everything below the highest seq seen was dropped as a resend.
    calls: list[str] = []
    server.on("toolCall", lambda sid, execution: calls.append(execution.call_id))
    client = (SSEClient if transport == "sse" else StreamClient)(server.base_url, token)
    try:
        client.hello()  # seq 1
        envelopes = [orjson.dumps({
            "id": f"m{seq}", "session": client.session_id, "seq": str(seq), "ts": "1",
            "type": "TOOL_CALL", "channel": "USER",
            "payload": {"call_id": f"c{seq}", "tool": "echo", "params": {"message": "x"}}})
            for seq in range(2, 52)]
        random.Random(14).shuffle(envelopes)

        def post(body: bytes) -> int:
            return requests.post(f"{server.base_url}{path}?session={client.session_id}",
                                 data=body, timeout=timeout(10),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"}).status_code

        with ThreadPoolExecutor(max_workers=25) as pool:
            assert set(pool.map(post, envelopes)) == {202}
        done = [client.recv_type("TOOL_DONE", within=10)["payload"] for _ in range(50)]
        assert sorted(d["call_id"] for d in done) == sorted(f"c{seq}" for seq in range(2, 52))
        assert {d["status"] for d in done} == {"OK"}
        client.send("PING", "SYSTEM", {"nonce": "barrier"}, seq="52")
        client.recv_type("PONG", nonce="barrier")
        assert sorted(calls) == sorted(f"c{seq}" for seq in range(2, 52))  # each ran once
        assert [m for m in client.received if m["type"] in ("ERROR", "TOOL_DONE")] == [
            m for m in client.received if m["type"] == "TOOL_DONE"]
        assert len([m for m in client.received if m["type"] == "TOOL_DONE"]) == 50
    finally:
        client.close()
