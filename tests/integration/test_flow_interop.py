"""Flow control with clients that protoflask did not write (docs/PROTOCOL.md "Flow
control" and "Envelope"), over every transport:

- downstream credit is counted only for a client whose HELLO asks for it
  (``capabilities.flow_control.downstream: true``); one that merely announces
  ``initial_credit_messages`` and never sends FLOW_UPDATE is never stalled;
- upstream messages that arrive out of seq order (concurrent POSTs) are all processed;
  only a seq already seen is a retransmission.
"""

from __future__ import annotations



from ..support import wait_for


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
