"""The client socket under a WSGI request, for the transports that need it (the WebSocket
takes it over; the HTTP streams watch it for the client going away)."""

from __future__ import annotations

import socket
import sys
from typing import Any, Callable

import gevent
import gevent.socket

from ..pins import check_gevent_socket
from ..turns import give_turn

check_gevent_socket()  # hold_open reads gevent's socket internals: fail here if they moved


def raw_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The client socket under gunicorn or protoflask's own gevent server."""
    return environ.get("gunicorn.socket") or environ.get("protoflask.socket")


def shutdown(sock: socket.socket | None, how: int = socket.SHUT_RDWR) -> None:
    """Shut a socket down, ignoring one that is already gone."""
    if sock is None:
        return
    try:
        sock.shutdown(how)
    except OSError:
        pass


def immediate_send(sock: Any) -> Callable[[Any], int] | None:
    """A ``send(data) -> bytes taken`` that never waits for room in the kernel's buffer
    (it raises BlockingIOError instead), or None where there is none.

    For a gevent socket it is the send of the non-blocking descriptor under it (gevent's
    own send is Python code around that call that waits when the buffer is full). A TLS
    socket has none: its bytes must go through its TLS layer, never the descriptor. Any
    other socket (a blocking one, a test's fake) is its own send."""
    if is_tls(sock):
        return None
    if isinstance(sock, gevent.socket.socket):
        return sock._sock.send
    return sock.send


def read_wait(sock: Any) -> tuple[Callable[[Any], None], Any] | None:
    """``(wait, watcher)``: ``wait(watcher)`` is to be called before each ``recv``; None
    where there is nothing to call (any socket that is not gevent's: a blocking one, a
    test's fake).

    On gevent's plain socket it returns once ``sock`` has bytes to read. gevent's ``recv``
    tries the syscall first and waits only after it fails. On a connection whose client
    waits for each answer before it sends again, the try right after an answer always
    fails, and the failure (the syscall and a raised BlockingIOError) costs more than the
    wait (docs/PERFORMANCE.md, "p6-read"). The wait is the gevent socket's own, on its
    own read watcher, so ``recv``'s semantics stay: the socket's timeout applies, and a
    close from another greenlet wakes the reader.

    Either way every read is preceded by a turn for every other greenlet, so a client
    that never pauses cannot keep the worker to itself
    (tests/integration/test_reader_fairness.py). A TLS socket cannot wait on its
    descriptor (bytes its TLS layer already read and decrypted never make it readable
    again): it gets the turn alone (``turns.give_turn``).

    A pair rather than one callable: the reader calls the bound method itself, a
    Python-to-Python call that adds no C frame to the stack an idle greenlet keeps
    (a ``partial`` or a lambda there cost 0.4-0.6 KB per idle session)."""
    if not isinstance(sock, gevent.socket.socket):
        return None
    if is_tls(sock):
        return _take_a_turn, None
    wait, watcher = getattr(sock, "_wait", None), getattr(sock, "_read_event", None)
    if wait is None or watcher is None:  # a gevent without them: a turn, then recv
        return _take_a_turn, None
    return wait, watcher


def _take_a_turn(_watcher: Any) -> None:
    give_turn()


class PeerWatch:
    """Notices the client closing its side of a socket nothing else reads, without a
    greenlet of its own: a read watcher on the event loop whose callback peeks at the
    descriptor (never waits) and calls ``gone`` at the end of the read side or a reset.
    Bytes to read (a pipelined request) are left, and the watch ends, as the greenlet's
    ``recv(1, MSG_PEEK)`` returns on them. A greenlet per stream cost a spawn, a first
    run and a failed read at the open, and a kill (a switch in and out) at the end."""

    __slots__ = ("_io", "_peek", "_gone", "_own")

    #: The swap point of the watcher: the socket's own read watcher (gevent's
    #: ``_read_event``, idle while nothing reads the socket, and stopped again before
    #: anyone does: the watch ends with the response) where it is idle, or with False a
    #: new one on the descriptor (~1 us more, and an object per stream while it lasts).
    #: tests/transports/test_peer_watch.py holds the two equal.
    socket_watcher = True

    def __init__(self, sock: Any, gone: Callable[[], None]) -> None:
        self._peek = sock._sock.recv  # the non-blocking descriptor's: EAGAIN, never a wait
        self._gone = gone
        watcher: Any = sock._read_event if self.socket_watcher else None
        self._own = watcher is None or watcher.callback is not None
        if self._own:  # (a watcher that is waited on is its reader's)
            watcher = gevent.get_hub().loop.io(sock.fileno(), 1)
        self._io: Any = watcher
        watcher.start(self._readable)

    def _readable(self) -> None:
        try:
            data = self._peek(1, socket.MSG_PEEK)
        except BlockingIOError:  # woken with nothing to read after all: keep watching
            return
        except OSError:
            data = b""
        self.kill()
        if not data:
            self._gone()

    @property
    def watching(self) -> bool:
        return self._io is not None

    def kill(self, block: bool = True) -> None:
        """Stop watching (a greenlet's ``kill``, for the one who ends the stream)."""
        watcher, self._io = self._io, None
        if watcher is not None:
            watcher.stop()
            if self._own:  # the socket's own is the socket's to close
                watcher.close()


def peer_watch(sock: Any, gone: Callable[[], None]) -> PeerWatch | None:
    """A ``PeerWatch`` of ``sock``, or None where it has no descriptor to peek at: a TLS
    socket (its bytes go through its TLS layer), a socket that is not gevent's. gevent's
    own socket class exactly: its TLS socket is a subclass (and ``is_tls``'s look-ups in
    the loaded modules would cost more than the watch)."""
    if type(sock) is not gevent.socket.socket:
        return None
    return PeerWatch(sock, gone)


def is_tls(sock: Any) -> bool:
    """Whether ``sock`` is a TLS socket (gevent's or the standard library's). Looked up
    among the loaded modules: importing ssl here, before gevent patches it, would make
    gevent warn; and if ssl was never loaded no socket is a TLS one."""
    if type(sock) is gevent.socket.socket:  # the common case: a TLS socket is a subclass
        return False
    for name in ("gevent.ssl", "ssl"):
        module = sys.modules.get(name)
        if module is not None and isinstance(sock, module.SSLSocket):
            return True
    return False


def hold_open(sock: Any) -> bool:
    """Keep a gevent socket open past its server's ``close()``, as a file object made by
    ``makefile()`` keeps it (``socket._io_refs``: the close then only marks it closed),
    until ``let_go``. False (nothing held) for any other socket. The head lane's
    WebSocket keeps the socket object gunicorn accepted, rather than detaching its
    descriptor into a new one (four syscalls and two objects a connection)."""
    if type(sock) is not gevent.socket.socket:
        return False
    sock._io_refs += 1
    return True


def let_go(sock: Any) -> None:
    """Give back what ``hold_open`` held: the socket closes now if it was closed
    meanwhile (``socket._decref_socketios``), else at its next ``close()``."""
    sock._decref_socketios()
