"""A node's TCP link to a real redis-server that a test can slow down, as a congested
network would: while ``hold(marker)`` is on, a chunk a connection sends that contains
``marker`` (and everything that connection sends after it) waits in the link until
``release()``; every other connection, and the replies, pass at once. With b"EVALSHA"
it holds a node's journal batches (its only EVALSHA) and nothing else it writes."""

from __future__ import annotations

import socket
import threading
from typing import Callable

from ..support import free_listener, wait_for


class RedisLink:
    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.listener = free_listener()
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        #: per connection: (its socket to Redis, the chunks it holds, in order)
        self._held: list[tuple[socket.socket, list[bytes]]] = []
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def holds(self, needle: bytes) -> bool:
        """Whether a chunk held now contains ``needle``."""
        with self._lock:
            return any(needle in chunk for _, chunks in self._held for chunk in chunks)

    def wait_holding(self, needle: bytes, what: str) -> None:
        wait_for(lambda: self.holds(needle), 10, what)

    def release(self) -> None:
        """Send what was held, in order, and hold nothing more."""
        with self._lock:
            self._marker = None
            held, self._held = self._held, []
            for upstream, chunks in held:
                for chunk in chunks:
                    try:
                        upstream.sendall(chunk)
                    except OSError:
                        break

    def close(self) -> None:
        self.release()
        self.listener.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.close()
                except OSError:
                    pass

    # -- the link ------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.redis_port))
            except OSError:  # Redis is gone (the test's end): so is this connection
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, self._send_up),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, _send),
                             daemon=True).start()

    def _send_up(self, upstream: socket.socket, chunk: bytes) -> None:
        with self._lock:
            for sock, chunks in self._held:
                if sock is upstream:  # this connection holds already: keep its order
                    chunks.append(chunk)
                    return
            if self._marker is not None and self._marker in chunk:
                self._held.append((upstream, [chunk]))
                return
            upstream.sendall(chunk)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket,
              send: Callable[[socket.socket, bytes], None]) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                send(dst, chunk)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _send(dst: socket.socket, chunk: bytes) -> None:
    dst.sendall(chunk)
