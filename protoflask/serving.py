"""The embedded gevent server behind ``ProtoServer.start()``: gevent's WSGI server with
protoflask's request handler, listening in this thread's hub when the process is
monkey-patched, else in a background thread with its own hub (``call`` runs a function
there and waits for its result, so plain threads may use the server).
"""

from __future__ import annotations

import concurrent.futures
import errno
import gc
import logging
import socket
import threading
from typing import Any, Callable

import gevent
import gevent.event
from flask import Flask
from gevent.pywsgi import WSGIHandler, WSGIServer

from .logs import RedactTokens
from .web import ConnectionTakenOver

#: seconds ``stop`` gives open connections to finish, and the WSGI server to stop
STOP_TIMEOUT = 3.0


#: A serving worker's collection thresholds (Python's: 700, 10, 10), unless the process
#: set its own: a full collection per 100 gen-1 ones. A storm of 10,000 sessions made
#: nine full collections of all of them, half the worker's CPU (PERFORMANCE.md p7-storm).
SERVING_GC_THRESHOLDS = (700, 10, 100)


def freeze_startup_heap() -> None:
    """The GC policy of a serving process, applied once it serves (the embedded server
    here, gunicorn's worker in ``gunicorn_worker.GeventWorker.load_wsgi``): what exists
    now (modules, the app, its config) lives as long as the process, so it is collected
    once and frozen out of every later full collection, whose pauses are the latency tail
    (docs/PERFORMANCE.md). Python's default thresholds become ``SERVING_GC_THRESHOLDS``
    unless the process set its own."""
    gc.collect()
    gc.freeze()
    if gc.get_threshold() == (700, 10, 10):
        gc.set_threshold(*SERVING_GC_THRESHOLDS)


def error_body(code: int) -> tuple[str, bytes]:
    """The status line and JSON body of an error the WSGI server answers by itself."""
    reason, name, message = {
        400: ("Bad Request", "INVALID_MESSAGE", "malformed HTTP request"),
        414: ("Request-URI Too Long", "URI_TOO_LONG", "the request line is too long"),
    }.get(code, ("Internal Server Error", "INTERNAL_ERROR", "internal error"))
    body = b'{"error":{"code":"%s","message":"%s"}}' % (name.encode(), message.encode())
    return f"{code} {reason}", body


def raw_error(code: int) -> bytes:
    status, body = error_body(code)
    return (f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


class Handler(WSGIHandler):
    """gevent's handler, exposing the client socket to the WebSocket route."""

    #: EBADF too: the socket was closed under the response on purpose (an SSE client that
    #: does not read is dropped, the close logged once by the dispatcher), so its blocked
    #: write ends with gevent's cancel_wait_ex, which is not an application failure
    ignored_socket_errors = WSGIHandler.ignored_socket_errors + (errno.EBADF,)

    def handle(self) -> None:
        # pywsgi writes a response's head and a small body separately; with Nagle on,
        # the body waited for the client's delayed ACK of the head (~40 ms per POST).
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass  # not TCP (a Unix socket)
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            # the client left while gevent answered it (a 400 to a malformed request, say):
            # not worth the traceback gevent's hub would print for it
            self.close_connection = True

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ["protoflask.socket"] = self.socket
        return environ

    def handle_one_request(self) -> Any:
        """gevent's, except that a request it cannot parse (400, 414) is answered with
        the JSON error body every other error has, not an empty or plain-text one.

        Every request starts with a turn for every other greenlet: gevent switches only
        when a read or a write has to wait, and a client that pipelines its requests
        leaves the next one in the buffer every time, so this connection would be served
        alone until it stopped (gunicorn_worker.GeventWorker does the same there;
        tests/integration/test_reader_fairness.py)."""
        gevent.sleep(0)
        result = super().handle_one_request()
        if isinstance(result, tuple) and len(result) == 2:
            return result[0], raw_error(int(result[0]))
        return result

    def _send_error_response_if_possible(self, error_code: int) -> None:
        """gevent's plain-text 400/500 for errors outside the application, as JSON."""
        if self.response_length:
            self.close_connection = True
            return
        status, body = error_body(error_code)
        try:
            self.start_response(status, [("Content-Type", "application/json"),
                                         ("Content-Length", str(len(body))),
                                         ("Connection", "close")])
            self.write(body)
        except OSError:
            self.close_connection = True

    def process_result(self) -> None:
        """gevent's, except that an empty chunk before the head sends the head: a
        streaming response flushes its status line that way when it has nothing to write
        yet (gevent skips empty chunks, and would hold the head until the first bytes)."""
        for data in self.result:
            if data:
                self.write(data)
            elif not self.headers_sent:
                # a 100 Continue still owed to the request body goes first, then the head
                # alone (an empty chunk on the wire would end the body)
                send_continue = getattr(self.wsgi_input, "_send_100_continue", None)
                if send_continue is not None:
                    send_continue()
                self.write(b"")
        if self.status and not self.headers_sent:
            self.write(b"")
        if self.response_use_chunked:
            self._sendall(b"0\r\n\r\n")

    def run_application(self) -> None:
        try:
            super().run_application()
        except ConnectionTakenOver:
            self.close_connection = True


class EmbeddedServer:
    """One WSGI server's listening socket and the hub (and thread) it runs in."""

    def __init__(self) -> None:
        self.wsgi: WSGIServer | None = None
        self.thread: threading.Thread | None = None
        self.hub_loop: Any = None
        self.stop_event: gevent.event.Event | None = None
        self.port: int | None = None

    @property
    def running(self) -> bool:
        return self.wsgi is not None

    def start(self, app: Flask, host: str, port: int, listening: Callable[[], None]) -> None:
        """Listen on host:port and return once listening; ``listening`` runs in the
        serving hub right after (it starts the server's timers there)."""
        if self.wsgi is not None:
            raise RuntimeError("server already started")
        import gevent.monkey

        if gevent.monkey.is_module_patched("socket"):
            self._listen(app, host, port, listening)
            return
        ready = threading.Event()
        failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve_in_thread,
                                       args=(app, host, port, listening, ready, failure),
                                       name="protoflask", daemon=True)
        self.thread.start()
        ready.wait()
        if failure:
            self.thread.join()
            self.thread = None
            raise failure[0]

    def _listen(self, app: Flask, host: str, port: int, listening: Callable[[], None]) -> None:
        error_log = logging.getLogger("protoflask.wsgi")  # quotes raw request lines:
        if not any(isinstance(f, RedactTokens) for f in error_log.filters):
            error_log.addFilter(RedactTokens())  # never with their tokens
        self.wsgi = WSGIServer((host, port), app, handler_class=Handler, log=None,
                               error_log=error_log)
        self.wsgi.start()
        self.port = self.wsgi.server_port
        listening()
        freeze_startup_heap()

    def _serve_in_thread(self, app: Flask, host: str, port: int, listening: Callable[[], None],
                         ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            self.hub_loop = gevent.get_hub().loop
            self.stop_event = gevent.event.Event()
            self._listen(app, host, port, listening)
        except BaseException as exc:
            failure.append(exc)
            self.hub_loop = None
            ready.set()
            return
        ready.set()
        self.stop_event.wait()

    def stop(self, closing: Callable[[], list[Any]], stopped: Callable[[], None]) -> None:
        """Stop listening, in the serving hub: ``closing`` closes the transports (and
        returns the sessions whose transports are closing), ``stopped`` runs once the WSGI
        server stopped; then the serving thread, if any, ends."""
        self.call(self._stop_in_hub, closing, stopped)
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT + 2)
            self.thread = None
        self.hub_loop = None
        self.wsgi = None

    def _stop_in_hub(self, closing: Callable[[], list[Any]], stopped: Callable[[], None]) -> None:
        sessions = closing()
        # Let each closed transport finish its close handshake (its reader detaches it)
        # before the hub's thread ends: the WSGI server has no pool, so its stop() does
        # not wait for handlers, and a hub that is gone never completes them.
        with gevent.Timeout(STOP_TIMEOUT, False):
            while any(live.transport is not None for live in sessions):
                gevent.sleep(0.01)
        gevent.sleep(0)
        assert self.wsgi is not None
        self.wsgi.stop(timeout=STOP_TIMEOUT)
        stopped()
        if self.stop_event is not None:
            self.stop_event.set()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in the serving hub and return its result (or raise its error)."""
        loop = self.hub_loop
        if loop is None or self.thread is None or threading.current_thread() is self.thread:
            return fn(*args)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        loop.run_callback_threadsafe(lambda: gevent.spawn(run))
        return future.result()
