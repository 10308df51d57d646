"""A WebSocket the head lane admits keeps the socket object gunicorn accepted, held open
past gunicorn's close (``transports.sockets.hold_open``; the swap point
``web.KEEP_HANDED_SOCKET``), as it was served on its descriptor detached into a new one:
the same bytes through the upgrade, the HELLO and its reply, a PING, a close; and no
descriptor left behind once the connections end."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
from typing import Iterator

import pytest

from ..support import SECRET, GunicornServer, timeout, wait_for

from protoflask.auth import TokenAuthority

WORKERS = "tests.fixtures.head_lane_workers."
KEY = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
HELLO = (b'{"id":"c1","session":"","seq":"1","ts":"0","type":"HELLO","channel":"SYSTEM",'
         b'"payload":{"proto_version":"1.1.2","accept_major":[1],"accept_events":[]}}')
PING = (b'{"id":"c2","session":"","seq":"2","ts":"0","type":"PING","channel":"SYSTEM",'
        b'"payload":{"nonce":"n1"}}')


def frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A masked client frame (mask 0: the payload as it is)."""
    n = len(payload)
    head = struct.pack("!BB", 0x80 | opcode, 0x80 | n) if n < 126 \
        else struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    return head + b"\0\0\0\0" + payload


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, GunicornServer]]:
    started: dict[str, GunicornServer] = {}
    try:
        started["kept"] = GunicornServer()
        started["detached"] = GunicornServer(args=("-k", WORKERS + "DetachingHeadWorker"))
        yield started
    finally:
        for server in started.values():
            server.stop()


def token(user: str = "alice") -> str:
    return TokenAuthority(SECRET).issue(user)


def open_socket(server: GunicornServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout(5))
    sock.sendall((f"GET /proto/websocket?token={token()} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Upgrade: websocket\r\nConnection: Upgrade\r\n{KEY}\r\n").encode())
    return sock


def read_some(sock: socket.socket, until: bytes) -> bytes:
    data = b""
    while until not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    return data


def conversation(server: GunicornServer) -> bytes:
    """The upgrade, HELLO and its reply, a PING and its PONG, a close and its answer: what
    the server wrote, made comparable (the Date, session ids, timestamps)."""
    sock = open_socket(server)
    try:
        data = read_some(sock, b"\r\n\r\n")
        sock.sendall(frame(HELLO))
        data += read_some(sock, b'"HELLO"')
        sock.sendall(frame(PING))
        data += read_some(sock, b'"PONG"')
        sock.sendall(frame(struct.pack("!H", 1000), 0x8))
        data += read_some(sock, b"never")  # until the server closes
    finally:
        sock.close()
    data = re.sub(rb"\r\nDate: [^\r]*", b"", data)
    data = re.sub(rb'"ts":"\d+"', b'"ts":"-"', data)
    return re.sub(rb"[0-9a-f]{32}", b"<session>", data)


def test_served_on_the_kept_socket_as_on_a_detached_one(
        servers: dict[str, GunicornServer]) -> None:
    kept, detached = conversation(servers["kept"]), conversation(servers["detached"])
    assert kept == detached
    assert kept.startswith(b"HTTP/1.1 101 ") and b'"PONG"' in kept, kept
    assert kept.endswith(b"\x88\x02\x03\xe8"), kept[-20:]  # the close answered


def worker_fds(server: GunicornServer) -> int:
    kids = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True,
                          text=True).stdout.split()
    return len(os.listdir(f"/proc/{kids[0]}/fd"))


def test_no_descriptor_is_left_behind(servers: dict[str, GunicornServer]) -> None:
    """Twenty conversations, each closed by its client after the close handshake, and
    ten dropped without one: the worker holds as many descriptors as before."""
    server = servers["kept"]
    conversation(server)  # first-use descriptors (logs, Redis-less caches) opened
    before = worker_fds(server)
    for _ in range(20):
        conversation(server)
    for _ in range(10):
        sock = open_socket(server)
        assert read_some(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 101 ")
        sock.close()
    wait_for(lambda: worker_fds(server) <= before, within=10,
             what=f"the worker's descriptors back to {before}")
