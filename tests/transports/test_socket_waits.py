"""The WebSocket reader's wait for a readable socket (``transports.sockets.read_wait``)
on real gevent sockets: it returns once bytes arrive, a close from another greenlet wakes
it as it wakes gevent's own ``recv``, a TLS socket gets a turn for the other greenlets
instead, and a non-gevent socket nothing."""

from __future__ import annotations

import socket

import gevent
import gevent.socket
import gevent.ssl
import pytest

from protoflask.transports.sockets import read_wait


@pytest.fixture
def pair():
    a, b = gevent.socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_the_wait_returns_once_bytes_arrive(pair) -> None:
    reader, writer = pair
    found = read_wait(reader)
    assert found is not None
    wait, watcher = found
    got: list[bytes] = []

    def read() -> None:
        wait(watcher)
        got.append(reader.recv(100))

    g = gevent.spawn(read)
    gevent.sleep(0.05)
    assert not got and not g.dead  # nothing to read yet: still waiting
    writer.sendall(b"hello")
    g.join(timeout=5)
    assert g.successful(), g.exception
    assert got == [b"hello"]


def test_a_close_from_another_greenlet_wakes_the_wait(pair) -> None:
    reader, _writer = pair
    found = read_wait(reader)
    assert found is not None
    wait, watcher = found
    g = gevent.spawn(wait, watcher)
    gevent.sleep(0.05)
    assert not g.dead
    reader.close()
    g.join(timeout=5)
    assert g.dead, "the waiting greenlet was left waiting on a closed socket"
    assert isinstance(g.exception, OSError), g.exception


def test_the_socket_timeout_applies(pair) -> None:
    reader, _writer = pair
    reader.settimeout(0.05)
    found = read_wait(reader)
    assert found is not None
    wait, watcher = found
    with pytest.raises(TimeoutError):
        wait(watcher)


def test_a_tls_socket_gets_a_turn_instead_and_other_sockets_nothing() -> None:
    context = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_CLIENT)
    plain = gevent.socket.socket()
    tls = context.wrap_socket(plain, server_hostname="localhost",
                              do_handshake_on_connect=False)
    try:
        found = read_wait(tls)  # no wait on the descriptor: OpenSSL may hold bytes
        assert found is not None
        wait, watcher = found
        assert watcher is None
        others_ran: list[bool] = []
        gevent.spawn(others_ran.append, True)
        wait(watcher)  # returns at once, nothing to read, after the others had a turn
        assert others_ran == [True]
    finally:
        tls.close()

    class Fake:
        def recv(self, n: int) -> bytes:
            return b""

    assert read_wait(Fake()) is None


def test_a_held_socket_outlives_its_servers_close_until_let_go() -> None:
    """``hold_open``: the server's close (gunicorn's, after the lane's request) only marks
    the socket closed; it reads and writes on; ``let_go`` closes it then. Let go before
    any close, it closes at its next ``close()``. Any other socket is not held."""
    from protoflask.transports.sockets import hold_open, let_go

    ours, peer = gevent.socket.socketpair()
    try:
        assert hold_open(ours)
        ours.close()  # the server's
        peer.sendall(b"ping")
        assert ours.recv(4) == b"ping"
        ours.sendall(b"pong")
        assert peer.recv(4) == b"pong"
        let_go(ours)
        assert ours.fileno() == -1
        assert peer.recv(4) == b""  # closed for real: the peer reads the end
    finally:
        peer.close()
    ours, peer = gevent.socket.socketpair()
    try:
        assert hold_open(ours)
        let_go(ours)
        assert ours.fileno() != -1
        ours.close()
        assert ours.fileno() == -1
    finally:
        peer.close()
    plain = socket.socket()
    try:
        assert not hold_open(plain)
    finally:
        plain.close()
