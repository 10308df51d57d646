"""gunicorn settings: ``gunicorn -k gevent wsgi:app`` picks this file up by itself."""

import importlib.util
import os
import resource
import sys
import time

import gevent
from gunicorn.glogging import Logger

worker_class = "gevent"
bind = [f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8080')}"]
# Headroom (docs/DEPLOYMENT.md, "Slow clients"): gunicorn's default of 1000 would cap
# maxConnections per worker and let slow clients starve /health. Besides MAX_CONNECTIONS
# live transports, a worker takes as many POST bodies being read (each cut after
# BODY_TIMEOUT, at most MAX_CONNECTIONS_PER_USER per user) and 1000 more for /health,
# /metrics and connections still sending their headers (cut after `keepalive` seconds).
_MAX_CONNECTIONS = int(os.environ.get("MAX_CONNECTIONS", "1000"))
worker_connections = 2 * _MAX_CONNECTIONS + 1000
# The gevent worker must monkey-patch before the application imports.
preload_app = False
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
graceful_timeout = 10
# gunicorn's gevent worker reads every request head (the first one too) within keepalive
# seconds, or closes the connection: this bounds a header slowloris.
keepalive = 5
# Seconds a worker may go without a heartbeat (a blocked event loop) before it is killed.
timeout = 30
#: Seconds of graceful_timeout kept for closing connections after the drain (close
#: handshakes, the ends of streams) before gunicorn kills what is left.
CLOSE_MARGIN = 3



def _load_logs():
    """protoflask/logs.py on its own (stdlib only): importing the protoflask package in
    gunicorn's master would load Flask and gevent's pywsgi before the worker
    monkey-patches."""
    package = importlib.util.find_spec("protoflask")
    path = os.path.join(package.submodule_search_locations[0], "logs.py")
    spec = importlib.util.spec_from_file_location("_protoflask_logs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_logs = _load_logs()
_redact, _redacted_query = _logs.redact, _logs.redacted_query


class RedactingLogger(Logger):
    """gunicorn's logger, with tokens kept out of its lines: the access log's request line
    and query (``%(r)s``, ``%(q)s``, ``%(U)s``...) and headers (``%({authorization}i)s``),
    and error lines that quote a malformed request line."""

    def setup(self, cfg):
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            if not any(isinstance(f, _logs.RedactTokens) for f in logger.filters):
                logger.addFilter(_logs.RedactTokens())

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        for key, value in atoms.items():
            if key == "{authorization}i" and value != "-":
                atoms[key] = "***"
            elif key == "q" and isinstance(value, str):  # the query string, without "?"
                atoms[key] = _redacted_query(value)
            elif isinstance(value, str):
                atoms[key] = _redact(value)
        return atoms


logger_class = RedactingLogger


def _raise_open_files_limit():
    """Let a worker hold worker_connections sockets (the soft limit is often 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = worker_connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit), hard))


def on_starting(server):
    """Raise the open-files limit the workers inherit. Refuse several workers without
    Redis: each would hold its own sessions in memory,
    so a resume, a follow-up POST or send_message landing on another worker would silently
    miss them. With REDIS_URL the workers share sessions through Redis."""
    _raise_open_files_limit()
    if server.cfg.workers > 1 and not any(os.environ.get(name, "").strip()
                                          for name in ("REDIS_URL", "REDIS_SENTINELS")):
        raise SystemExit(
            f"protoflask: {server.cfg.workers} workers configured, but sessions live in each "
            "worker's memory, so requests landing on another worker would not find them. Set "
            "REDIS_URL (redis://host:6379/0) or REDIS_SENTINELS to share sessions between "
            "workers, or run one worker (WEB_CONCURRENCY=1, -w 1).")


def _protoserver(worker):
    app = worker.wsgi
    extensions = getattr(app, "extensions", {})
    return extensions.get("protoflask")


def post_worker_init(worker):
    """Start protoflask's timers in the worker, and drain when it is told to quit
    (SIGTERM): gunicorn stops accepting, protoflask refuses new connections (503
    SHUTTING_DOWN, /health 503 draining) and gives running tools the graceful timeout less
    CLOSE_MARGIN to finish, then closes every client (1001, or the end of its stream),
    cancels what is left and emits ``stopped``."""
    server = _protoserver(worker)
    if server is None:
        return
    if worker.cfg.workers > 1 and not server.clustered:
        # redisUrl set somewhere REDIS_URL does not show (app.config, code): still refuse
        worker.log.critical("protoflask: several workers need redisUrl; this app has none")
        sys.exit(3)  # gunicorn: "worker failed to boot", the arbiter stops
    server.serving_started()

    def watch_for_quit():
        while worker.alive:
            gevent.sleep(0.1)
        server.drain(max(0.0, worker.cfg.graceful_timeout - CLOSE_MARGIN))
        server.serving_stopped()
        # WebSockets run apart from gunicorn's pool of requests (protoflask/web.py), which
        # does not wait for them: let their close handshakes finish here
        deadline = time.monotonic() + CLOSE_MARGIN
        while server.engine.stats.active_connections and time.monotonic() < deadline:
            gevent.sleep(0.01)

    global _quit_watcher
    _quit_watcher = gevent.spawn(watch_for_quit)


def pre_request(worker, req):
    """Every request starts with a turn for every other greenlet. gevent switches only
    when a read or a write has to wait; a client that pipelines requests (keep-alive
    POSTs sent without waiting for the answers, or a flood of GET /health) leaves the
    next one in the buffer every time, so gunicorn would serve that one connection
    until it stopped: no other request, no WebSocket, not even /health
    (tests/integration/test_reader_fairness.py). Then gunicorn's own debug line."""
    gevent.sleep(0)
    worker.log.debug("%s %s", req.method, req.path)


#: the worker's drain (post_worker_init); None in the master
_quit_watcher = None


def worker_exit(arbiter, worker):
    """In the worker once gunicorn's loop has ended, which it does as soon as no HTTP
    request is left: wait for protoflask's drain and the WebSockets' close handshakes.
    (gunicorn also calls this in the master, where there is nothing to wait for.)"""
    if _quit_watcher is not None:
        _quit_watcher.join(worker.cfg.graceful_timeout)
