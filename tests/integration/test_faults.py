"""Faults: clients killed mid-frame, mid-tool-call, mid-SSE-POST and mid-stream-line, on
the embedded server and under gunicorn; afterwards no greenlet, connection or session is
left beyond the session kept for resume (until replayWindowTime), and the server answers.
Then SIGTERM under gunicorn: a graceful drain."""

from __future__ import annotations

import signal
import socket
import time

import orjson
import pytest
import requests

from ..hardening_support import (
    live_with_baseline,
    HELLO, Live, answers, envelope, rst_close, settled, vitals, ws_frame, ws_hello, ws_open,
)
from ..support import (
    HTTPResponseReader, SSEClient, StreamClient, WSClient, open_http, timeout, wait_for,
)


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    yield from live_with_baseline(request.param, replayWindowTime=1500)


def kept_then_gone(live: Live, sid: str | None = None) -> None:
    """Right after the fault: no live connection, the session kept for resume; after
    replayWindowTime: no session, no greenlet beyond the baseline; the server answers."""
    now = wait_for(lambda: (v := vitals(live.base_url))["activeConnections"] == 0 and v,
                   what="the connection slot back")
    assert now["sessions"] >= 1 and now["connectedSessions"] == 0, now
    answers(live.base_url, live.token())
    settled(live.base_url, live.baseline)  # type: ignore[attr-defined]


def test_client_killed_mid_frame(live):
    sock = ws_open(live.base_url, live.token())
    ws_hello(sock)
    frame = ws_frame(orjson.dumps(envelope("PING", payload={"nonce": "n"}, seq=2)))
    sock.sendall(frame[:len(frame) // 2])
    wait_for(lambda: vitals(live.base_url)["connectedSessions"] == 1, what="the session")
    rst_close(sock)
    kept_then_gone(live)


def test_client_killed_mid_tool_call_and_the_result_waits_for_the_resume(live):
    client = WSClient(live.base_url, live.token("mid-tool"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "slow", "tool": "sleep",
                                      "params": {"seconds": 0.4}})
    wait_for(lambda: vitals(live.base_url)["runningTools"] == 1, what="the tool to run")
    sid = client.session_id
    rst_close(client.ws.socket)
    wait_for(lambda: vitals(live.base_url)["runningTools"] == 0, what="the tool to finish")
    resumed = WSClient(live.base_url, live.token("mid-tool"), session=sid, last_seq=1)
    try:
        done = resumed.recv_type("TOOL_DONE")
        assert done["payload"] == {"call_id": "slow", "status": "OK", "result": {"slept": 0.4}}
    finally:
        resumed.close()
    kept_then_gone(live)


def test_client_killed_mid_tool_call_never_back(live):
    client = WSClient(live.base_url, live.token())
    client.hello()
    for i in range(3):
        client.send("TOOL_CALL", payload={"call_id": f"c{i}", "tool": "sleep",
                                          "params": {"seconds": 0.3}})
    wait_for(lambda: vitals(live.base_url)["runningTools"] == 3, what="the tools to run")
    rst_close(client.ws.socket)
    kept_then_gone(live)


def test_client_killed_mid_sse_post(live):
    client = SSEClient(live.base_url, live.token("poster"))
    try:
        client.hello()
        body = orjson.dumps(envelope("PING", payload={"nonce": "cut"}, seq=2))
        sock = open_http(live.base_url, "POST", f"/proto/sse?session={client.session_id}",
                         {"Authorization": f"Bearer {client.token}",
                          "Content-Length": str(len(body) + 500)}, body)
        rst_close(sock)
        # the stream and its session are untouched: the next message is answered
        client.send("PING", "SYSTEM", {"nonce": "after-cut"}, seq="3")
        client.recv_type("PONG", nonce="after-cut")
        assert not [m for m in client.received if m["type"] == "PONG"
                    and m["payload"]["nonce"] == "cut"]
    finally:
        client.close()
    kept_then_gone(live)


def test_client_killed_mid_stream_line(live):
    client = StreamClient(live.base_url, live.token("liner"))
    client.hello()
    client.send_chunk(b'{"id":"c2","session":"","seq":"2","ts":"1","type":"PI')
    sid = client.session_id
    wait_for(lambda: vitals(live.base_url)["connectedSessions"] == 1, what="the stream")
    rst_close(client.sock)
    client.close()
    wait_for(lambda: vitals(live.base_url)["activeConnections"] == 0, what="the slot back")
    # the half line was not taken for a message; the session resumes
    resumed = StreamClient(live.base_url, live.token("liner"), session=sid, last_seq=1)
    try:
        resumed.send("PING", "SYSTEM", {"nonce": "resumed"}, seq="2")
        resumed.recv_type("PONG", nonce="resumed")
    finally:
        resumed.close()
    kept_then_gone(live)


# -- SIGTERM under gunicorn ----------------------------------------------------------------------


def keepalive_health(base_url: str) -> socket.socket:
    """A keep-alive connection that already asked /health once (and got 200): gunicorn
    still answers a request on it after SIGTERM, when it no longer accepts new ones."""
    sock = open_http(base_url, "GET", "/health")
    status, body = read_response(sock)
    assert status == 200, body
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    reader = HTTPResponseReader(sock)
    status, _ = reader.read_head()
    return status, reader.read_body()


def test_sigterm_drains_gracefully():
    live = Live("gunicorn", replayWindowTime=60000, heartbeatInterval=60000)
    output = ""
    probes: list[socket.socket] = []
    clients: list = []
    try:
        token = live.token("drain")
        probes += [keepalive_health(live.base_url) for _ in range(20)]
        ws, sse, stream = (WSClient(live.base_url, token), SSEClient(live.base_url, token),
                           StreamClient(live.base_url, token))
        clients += [ws, sse, stream]
        for client in clients:
            client.hello()
        ws.send("TOOL_CALL", payload={"call_id": "in-flight", "tool": "sleep",
                                      "params": {"seconds": 1.5}})
        wait_for(lambda: vitals(live.base_url)["runningTools"] == 1, what="the tool to run")
        live.gunicorn.proc.send_signal(signal.SIGTERM)

        statuses = []
        for sock in probes:  # one request each: gunicorn closes it after answering
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body = read_response(sock)
            statuses.append(status)
            if status == 503:
                assert orjson.loads(body)["status"] == "draining"
                break
            time.sleep(timeout(0.1))  # spread the probes over the first seconds
        assert statuses and statuses[-1] == 503, statuses

        # the running tool finishes within the grace period, then every client is closed
        done = ws.recv_type("TOOL_DONE", within=10)
        assert done["payload"]["status"] == "OK" and done["payload"]["call_id"] == "in-flight"
        with pytest.raises(Exception):  # noqa: B017 - the close, whichever way it surfaces
            while True:
                ws.ws.recv(timeout=timeout(10))
        assert ws.close_code == 1001
        sse.wait_ended(within=10)
        assert sse.close_code == 1001
        stream.wait_ended(within=10)
        live.gunicorn.proc.wait(timeout=timeout(15))
        assert live.gunicorn.proc.returncode == 0
    finally:
        for client in clients:
            client.close()
        for sock in probes:
            sock.close()
        output = live.stop()
    assert "PROTOFLASK-STOPPED" in output, output[-2000:]


def test_new_connections_are_refused_while_draining(make_server):
    """The same drain on the embedded server: during the grace period /health says
    draining and a new connection is 503 SHUTTING_DOWN; the running tool still ends OK."""
    import threading

    import gevent.event

    from protoflask import Tool

    server = make_server()
    gate = gevent.event.Event()  # the tool runs until the test has seen the drain

    def held(params, session_id, call_id, srv):
        gate.wait(10)
        return {"held": True}

    server.register_tool(Tool("held", "Runs until released.", {"type": "object"},
                              execute=held))
    client = WSClient(server.base_url, server.issue_token("a"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "t", "tool": "held", "params": {}})
    wait_for(lambda: server.engine.tools_busy(), what="the tool to run")

    stopper = threading.Thread(target=server.stop, kwargs={"grace": 5.0})
    stopper.start()
    try:
        wait_for(lambda: requests.get(server.base_url + "/health",
                                      timeout=timeout(5)).status_code == 503,
                 what="/health to say draining")
        health = requests.get(server.base_url + "/health", timeout=timeout(5)).json()
        assert health["status"] == "draining"
        resp = requests.post(server.base_url + "/proto/stream", data=orjson.dumps(HELLO),
                             headers={"Authorization": f"Bearer {server.issue_token('b')}"},
                             timeout=timeout(5))
        assert (resp.status_code, resp.json()["error"]["code"]) == (503, "SHUTTING_DOWN")
        # nor a connect ticket, which could only be used for a refused connection
        ticket = requests.post(server.base_url + "/proto/ticket", timeout=timeout(5),
                               headers={"Authorization": f"Bearer {server.issue_token('b')}"})
        assert (ticket.status_code, ticket.json()["error"]["code"]) == (503, "SHUTTING_DOWN")
        server._call(gate.set)
        done = client.recv_type("TOOL_DONE", within=5)
        assert done["payload"]["status"] == "OK"
    finally:
        stopper.join(timeout(15))
        client.close()
    assert client.close_code == 1001
