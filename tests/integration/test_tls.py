"""gunicorn serving TLS itself (``--certfile``/``--keyfile``): a WebSocket works end to end.

A TLS socket cannot be duplicated (the WebSocket is then served in its upgrade request)
and its bytes must go through its TLS layer (never a send on the descriptor under it):
the client here is simple-websocket's, over Python's own TLS, so a frame written in the
clear or a refused upgrade fails it.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time

import orjson
import pytest
import requests
import simple_websocket

from protoflask.auth import TokenAuthority

from ..hardening_support import UPGRADE_HEADERS, ZERO_MASK, ws_frame
from ..support import ROOT, SECRET, free_listener, hello_payload, timeout, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    where = tmp_path_factory.mktemp("tls")
    key, cert = where / "key.pem", where / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    listener = free_listener()
    port, fd = listener.getsockname()[1], listener.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--bind",
         f"fd://{fd}", "--certfile", str(cert), "--keyfile", str(key), "wsgi:app"],
        pass_fds=(fd,), env={**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)

    def healthy() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            return requests.get(f"https://127.0.0.1:{port}/health", verify=str(cert),
                                timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(healthy, within=20, what="gunicorn to answer /health over TLS")
        yield port, cert
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=timeout(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        listener.close()


def close_client(ws: simple_websocket.Client) -> None:
    """Close simple-websocket's client and wait for its reader thread. Its close() closes
    the socket while that thread may still be in a TLS read; the descriptor's number is
    then taken by this process's next socket, and the old TLS layer read (and answered)
    that connection's bytes: the next test's handshake failed with WRONG_VERSION_NUMBER
    (the server logged BAD_RECORD_MAC) now and then."""
    ws.close()
    ws.thread.join(timeout(10))
    assert not ws.thread.is_alive(), "simple-websocket's reader did not stop"


def envelope(session: str, seq: int, mtype: str, payload: dict) -> str:
    return orjson.dumps({"id": f"c{seq}", "session": session, "seq": str(seq), "ts": "1",
                         "type": mtype, "channel": "SYSTEM", "payload": payload}).decode()


def test_websocket_over_tls_served_by_gunicorn(tls_server):
    port, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    token = TokenAuthority(SECRET).issue("tls-user")
    ws = simple_websocket.Client(f"wss://127.0.0.1:{port}/proto/websocket?token={token}",
                                 ssl_context=context)
    try:
        ws.send(envelope("", 1, "HELLO", hello_payload()))
        hello = orjson.loads(ws.receive(timeout=timeout(5)))
        assert hello["type"] == "HELLO"
        session = hello["payload"]["session"]
        for seq in range(2, 52):  # many writes on the TLS socket, each answered in order
            ws.send(envelope(session, seq, "PING", {"nonce": f"n{seq}"}))
            pong = orjson.loads(ws.receive(timeout=timeout(5)))
            assert (pong["type"], pong["payload"]["nonce"]) == ("PONG", f"n{seq}")
    finally:
        close_client(ws)


def test_a_tls_client_that_never_pauses_does_not_starve_the_others(tls_server):
    """A TLS reader cannot wait on its descriptor (OpenSSL may hold bytes already read):
    it takes a turn for the other greenlets before each read instead
    (``transports/sockets.read_wait``), so a client writing PINGs without a pause over
    TLS does not keep the worker either (tests/integration/test_reader_fairness.py has
    the plain cases)."""
    port, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    authority = TokenAuthority(SECRET)
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout(10))
    flood = context.wrap_socket(raw, server_hostname="127.0.0.1")
    stop, running, sent = threading.Event(), threading.Event(), [0]

    def write() -> None:  # the answers are left unread: a few KB a second, never a full buffer
        seq = 1
        try:
            while not stop.is_set():
                flood.sendall(b"".join(
                    ws_frame(envelope("", seq + i, "PING", {"nonce": f"n{i}"}).encode(),
                             mask=ZERO_MASK)
                    for i in range(1000)))
                seq += 1000
                sent[0] += 1000
                running.set()
        except OSError:
            pass
        finally:
            running.clear()

    token = authority.issue("flooder")
    flood.sendall((f"GET /proto/websocket?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   + "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items())
                   + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += flood.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    flood.sendall(ws_frame(envelope("", 0, "HELLO", hello_payload()).encode(), mask=ZERO_MASK))
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        deadline = time.monotonic() + timeout(10)
        while sent[0] < 20_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sent[0] >= 20_000 and running.is_set(), sent
        ws = simple_websocket.Client(
            f"wss://127.0.0.1:{port}/proto/websocket?token={authority.issue('other')}",
            ssl_context=context)
        try:
            ws.send(envelope("", 1, "HELLO", hello_payload()))
            assert orjson.loads(ws.receive(timeout=timeout(10)))["type"] == "HELLO"
            served_during_flood = running.is_set()
        finally:
            close_client(ws)
        assert served_during_flood, "the other client was served only once the flood ended"
    finally:
        stop.set()
        writer.join(timeout(10))
        flood.close()
