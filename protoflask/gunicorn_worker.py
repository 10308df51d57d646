"""protoflask under gunicorn: its gevent worker class and its logger class.

``gunicorn.conf.py`` names both (``worker_class``, ``logger_class``)::

    gunicorn wsgi:app                                   # the repository's gunicorn.conf.py
    gunicorn -k protoflask.gunicorn_worker.GeventWorker app:app     # any other setup

``GeventWorker`` is gunicorn's gevent worker plus what protoflask needs of its host:

- in the master (``check_config``): the open-files limit raised to hold
  ``worker_connections`` sockets, and several workers refused without Redis (each would
  hold its own sessions in memory);
- in the worker, once the app is loaded: protoflask's timers started (``serving_started``)
  and the GC policy applied (``serving.freeze_startup_heap``: what exists then is frozen
  out of later full collections);
- a new connection's first request head, when it opens a transport (``GET
  /proto/websocket``, ``GET /proto/sse``, an opening ``POST /proto/stream``), read without
  gunicorn's parser (``handle``, protoflask/head_lane.py: the cost of a reconnect storm);
- every request starts with a turn for every other greenlet (``handle_request``);
- on SIGTERM, the drain (``run``): new connections refused (503 SHUTTING_DOWN, /health 503
  draining), running tools given the graceful timeout less ``CLOSE_MARGIN``, then every
  client closed (1001, or the end of its stream) and what is left cancelled, and the
  WebSockets' close handshakes waited for.

This module is imported by gunicorn's master, before the worker monkey-patches: it imports
gevent and gunicorn (as gunicorn's own gevent worker does) and protoflask's stdlib-only
``logs``, never Flask or the server (``protoflask/__init__`` is lazy).
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import gevent
from gunicorn.glogging import Logger
from gunicorn.workers import ggevent

from .logs import RedactTokens, redact, redacted_query

if TYPE_CHECKING:
    from .head_lane import HeadLane, HeadRequest
    from .server import ProtoServer

__all__ = ["CLOSE_MARGIN", "GeventWorker", "RedactingLogger", "gevent_means_protoflask",
           "untrack_greenlet_tree"]

#: Seconds of graceful_timeout kept for closing connections after the drain (close
#: handshakes, the ends of streams) before gunicorn kills what is left.
CLOSE_MARGIN = 3
#: file descriptors a worker needs beyond its connections (listeners, Redis, logs, ...)
SPARE_FILES = 256
#: exit status gunicorn reads as "worker failed to boot": the arbiter stops
WORKER_BOOT_ERROR = 3


def raise_open_files_limit(connections: int) -> None:
    """Let a worker hold ``connections`` sockets (the soft limit is often 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit), hard))


def untrack_greenlet_tree() -> None:
    """gevent's greenlet-tree tracking off in a worker, unless GEVENT_TRACK_GREENLET_TREE
    says otherwise: with it on, every spawn copies the spawner's last 10 stack frames
    into the new greenlet, which keeps them for its life (gevent's debugging tools read
    them; protoflask does not). A WebSocket is two spawns (its request, its connection),
    an NDJSON stream three (its request, its body reader, its peer watcher); ~7 us each
    here (docs/PERFORMANCE.md, p7-storm)."""
    if "GEVENT_TRACK_GREENLET_TREE" not in os.environ:
        gevent.config.track_greenlet_tree = False


class GeventWorker(ggevent.GeventWorker):
    """gunicorn's gevent worker, hosting a protoflask app (the module doc says what it adds).
    An app without protoflask is served as gunicorn's own worker would serve it."""

    #: The swap point of a new connection's first request head (head_lane.py): the lane
    #: for protoflask's own app where gunicorn's settings allow it (``load_wsgi``), None
    #: (gunicorn's parser for every request) otherwise, or when a subclass sets False.
    head_lane: HeadLane | None | bool = None
    #: where a connection the lane left to gunicorn must have its first head by (the
    #: keep-alive timeout counted from its accept, as gunicorn counts it), by greenlet
    _head_deadlines: dict[Any, float]
    _keepalive: float  # gunicorn's keepalive and pre_request settings, read once (with
    _pre_request: Any  # the lane)
    alive: bool  # gunicorn's (untyped)

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        """In the master, before any worker starts. Sessions live in each worker's memory
        unless REDIS_URL shares them: a resume, a follow-up POST or send_message landing on
        another worker would silently miss them, so several workers need Redis."""
        raise_open_files_limit(cfg.worker_connections)
        if cfg.workers > 1 and not any(os.environ.get(name, "").strip()
                                       for name in ("REDIS_URL", "REDIS_SENTINELS")):
            raise SystemExit(
                f"protoflask: {cfg.workers} workers configured, but sessions live in each "
                "worker's memory, so requests landing on another worker would not find "
                "them. Set REDIS_URL (redis://host:6379/0) or REDIS_SENTINELS to share "
                "sessions between workers, or run one worker (WEB_CONCURRENCY=1, -w 1).")

    def protoserver(self) -> ProtoServer | None:
        """The ProtoServer of the app this worker serves (None for another app)."""
        extensions = getattr(self.wsgi, "extensions", None)
        server = extensions.get("protoflask") if isinstance(extensions, dict) else None
        return server

    def load_wsgi(self) -> None:
        """Load the app, then start protoflask's timers in this worker (gunicorn calls
        ``post_worker_init`` right after, then ``run``)."""
        super().load_wsgi()
        server = self.protoserver()
        if server is None:
            return
        if self.cfg.workers > 1 and not server.clustered:
            # redisUrl set somewhere REDIS_URL does not show (app.config, code): still refuse
            self.log.critical("protoflask: several workers need redisUrl; this app has none")
            raise SystemExit(WORKER_BOOT_ERROR)
        server.serving_started()
        # imported here, in the worker with its app loaded: the master never imports it
        from .head_lane import HeadLane, lane_config_ok
        from .post_lane import SessionPostLane
        from .serving import freeze_startup_heap
        untrack_greenlet_tree()
        post_lane = getattr(self.wsgi, "wsgi_app", None)
        if self.head_lane is None and isinstance(post_lane, SessionPostLane) \
                and lane_config_ok(self.cfg):
            self.head_lane = HeadLane(post_lane, self.cfg)
            self._head_deadlines = {}
            # read once: a setting is a lookup through gunicorn's Config.__getattr__
            self._keepalive = self.cfg.keepalive
            self._pre_request = self.cfg.pre_request  # the default (lane_config_ok)
        freeze_startup_heap()

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        """A new connection: its first request head through the lane when it is one the
        lane reads (head_lane.py), else (and for every later request) gunicorn's."""
        lane = self.head_lane
        if not lane:
            return super().handle(listener, client, addr)
        assert not isinstance(lane, bool)
        client.setblocking(1)
        keepalive = self._keepalive
        deadline = time.monotonic() + keepalive
        data = lane.peek(client, keepalive)
        if not data:
            return  # nothing within keepalive, or the client left: gunicorn closes it too
        head = lane.read(data, addr, listener)
        if head is not None:
            if head.is_upgrade:
                try:
                    taken = lane.upgrade(head, client, addr, listener)
                except Exception as exc:  # what gunicorn answers 500 for (EMFILE on dup...)
                    self.handle_error(head, client, addr, exc)
                    return
                if taken:
                    self._pre_request(self, head)  # gunicorn's default: a debug line
                    self._count_request()
                    return
            elif self._serve_stream(lane, listener, head, client, addr):
                return
        greenlet = gevent.getcurrent()
        self._head_deadlines[greenlet] = deadline
        try:
            super().handle(listener, client, addr)
        finally:
            self._head_deadlines.pop(greenlet, None)
            lane.forget(client)

    def timeout_ctx(self) -> Any:
        """gunicorn's keep-alive timeout, less what the lane's peek already waited of the
        connection's first one."""
        deadline = self._head_deadlines.pop(gevent.getcurrent(), None) \
            if self.head_lane else None
        if deadline is None:
            return super().timeout_ctx()
        return gevent.Timeout(max(deadline - time.monotonic(), 0.001), False)

    def _count_request(self) -> None:
        """gunicorn's count of requests towards ``max_requests`` (its handle_request's)."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False

    def _serve_stream(self, lane: HeadLane, listener: Any, head: HeadRequest, client: Any,
                      addr: Any) -> bool:
        """A stream opened by a head the lane read (False: left to gunicorn, nothing taken
        off the socket): its response written as gunicorn's ``handle_request`` writes it
        (``lane_response``: gunicorn's writer's bytes, its head sent with the first
        chunk), its environ whole only where the access line reads it, then the rest of
        the connection served by gunicorn, as its ``AsyncWorker.handle`` would; its error
        handling repeated here."""
        resp = None
        try:
            timed = access_timed(self.log)  # (the access line reads the whole environ)
            opened = lane.open(head, client, addr, listener, whole=timed)
            if opened is None:
                return False
            environ, response = opened
            self._pre_request(self, head)  # gunicorn's default: a debug line
            self._count_request()
            resp = lane.response(head, client)
            if not self.alive:
                resp.force_close()
            started = datetime.now() if timed else None
            respiter = response(environ, resp.start_response)
            try:
                for item in respiter:
                    resp.write(item)
                resp.close()
            finally:
                if started is not None:
                    self.log.access(resp, head, environ, datetime.now() - started)
                if hasattr(respiter, "close"):
                    respiter.close()
            if resp.should_close():
                return True
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
            return True
        except (gevent.GreenletExit, SystemExit):
            return True
        except Exception as exc:
            if resp is not None and resp.headers_sent:
                self.log.exception("Error handling request")
                try:  # as gunicorn's handle_request: a 500 now would corrupt the stream
                    client.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return True
            self.handle_error(head, client, addr, exc)
            return True
        super().handle(listener, client, addr)
        return True

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        """Every request starts with a turn for every other greenlet. gevent switches
        only when a read or a write has to wait; a client that pipelines requests
        (keep-alive POSTs sent without waiting for the answers, or a flood of GET
        /health) leaves the next one in the buffer every time, so gunicorn would serve
        that one connection until it stopped: no other request, no WebSocket, not even
        /health (tests/integration/test_reader_fairness.py). protoflask's embedded server
        does the same (serving.Handler.handle_one_request)."""
        gevent.sleep(0)
        return super().handle_request(listener_name, req, sock, addr)

    def run(self) -> None:
        """gunicorn's loop, with protoflask's drain beside it: gunicorn's loop ends as soon
        as no HTTP request is left, and WebSockets run apart from its pool of requests
        (protoflask/web.py), so the worker waits for the drain before it exits."""
        server = self.protoserver()
        drain = gevent.spawn(self._drain_on_quit, server) if server is not None else None
        try:
            super().run()
        finally:
            if drain is not None:
                drain.join(self.cfg.graceful_timeout)

    def _drain_on_quit(self, server: ProtoServer) -> None:
        while self.alive:
            gevent.sleep(0.1)
        server.drain(max(0.0, self.cfg.graceful_timeout - CLOSE_MARGIN))
        server.serving_stopped()
        deadline = time.monotonic() + CLOSE_MARGIN
        while server.engine.stats.active_connections and time.monotonic() < deadline:
            gevent.sleep(0.01)


#: The swap point of a lane stream's access line: with True, no clock read and no call
#: when gunicorn's own ``Logger.access`` would return at once (its access log off), or
#: with False both always, as gunicorn's ``handle_request`` does
#: (tests/test_gunicorn_worker.py)
SKIP_QUIET_ACCESS = True


def access_timed(log: Any) -> bool:
    """Whether a stream's access line is to be timed and written: False only where the
    logger's ``access`` is gunicorn's own and its access log is off (``access`` then
    returns before it reads anything)."""
    return not (SKIP_QUIET_ACCESS and type(log).access is Logger.access
                and getattr(log, "access_log_enabled", True) is False)


def gevent_means_protoflask(arbiter: Any) -> None:
    """For gunicorn.conf.py's ``on_starting``: ``-k gevent`` on the command line overrides
    the file's ``worker_class``; with this file it means protoflask's gevent worker (which
    is gunicorn's, plus the drain and the rest), so the README's ``gunicorn -k gevent
    wsgi:app`` keeps them. gunicorn calls ``check_config`` after ``on_starting``."""
    if arbiter.worker_class is ggevent.GeventWorker:
        arbiter.worker_class = GeventWorker
        arbiter.log.info("protoflask: -k gevent serves with %s.%s",
                         GeventWorker.__module__, GeventWorker.__qualname__)


class RedactingLogger(Logger):
    """gunicorn's logger, with tokens kept out of its lines: the access log's request line
    and query (``%(r)s``, ``%(q)s``, ``%(U)s``...) and headers (``%({authorization}i)s``),
    and error lines that quote a malformed request line."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            if not any(isinstance(f, RedactTokens) for f in logger.filters):
                logger.addFilter(RedactTokens())

    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        for key, value in atoms.items():
            if key == "{authorization}i" and value != "-":
                atoms[key] = "***"
            elif key == "q" and isinstance(value, str):  # the query string, without "?"
                atoms[key] = redacted_query(value)
            elif isinstance(value, str):
                atoms[key] = redact(value)
        return atoms
