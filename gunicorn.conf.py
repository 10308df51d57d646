"""gunicorn settings: ``gunicorn -k gevent wsgi:app`` picks this file up by itself."""

import logging
import os
import re
import sys

import gevent
from gunicorn.glogging import Logger

worker_class = "gevent"
bind = [f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8080')}"]
# gunicorn's default of 1000 would silently cap maxConnections per worker; keep headroom
# for follow-up POSTs and /health next to the live transports.
worker_connections = int(os.environ.get("MAX_CONNECTIONS", "1000")) + 100
# The gevent worker must monkey-patch before the application imports.
preload_app = False
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
graceful_timeout = 10
keepalive = 5
#: Seconds of graceful_timeout kept for closing connections after the drain (close
#: handshakes, the ends of streams) before gunicorn kills what is left.
CLOSE_MARGIN = 3

# The rules of protoflask.logs.redact, repeated here: importing protoflask in gunicorn's
# master would load Flask and gevent's pywsgi before the worker monkey-patches.
_TOKEN_PARAM = re.compile(r"((?:t|%74)(?:o|%6f)(?:k|%6b)(?:e|%65)(?:n|%6e)=)[^&\s'\"]*",
                          re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)[^\s'\",]+", re.IGNORECASE)


def _redact(text):
    return _BEARER.sub(r"\1***", _TOKEN_PARAM.sub(r"\1***", text))


class _RedactTokens(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        clean = _redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


class RedactingLogger(Logger):
    """gunicorn's logger, with tokens kept out of its lines: the access log's request line
    and query (``%(r)s``, ``%(q)s``, ``%(U)s``...) and headers (``%({authorization}i)s``),
    and error lines that quote a malformed request line."""

    def setup(self, cfg):
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            if not any(isinstance(f, _RedactTokens) for f in logger.filters):
                logger.addFilter(_RedactTokens())

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        for key, value in atoms.items():
            if key == "{authorization}i" and value != "-":
                atoms[key] = "***"
            elif isinstance(value, str):
                atoms[key] = _redact(value)
        return atoms


logger_class = RedactingLogger


def on_starting(server):
    """Refuse several workers without Redis: each would hold its own sessions in memory,
    so a resume, a follow-up POST or send_message landing on another worker would silently
    miss them. With REDIS_URL the workers share sessions through Redis."""
    if server.cfg.workers > 1 and not os.environ.get("REDIS_URL", "").strip():
        raise SystemExit(
            f"protoflask: {server.cfg.workers} workers configured, but sessions live in each "
            "worker's memory, so requests landing on another worker would not find them. Set "
            "REDIS_URL (redis://host:6379/0) to share sessions between workers, or run one "
            "worker (WEB_CONCURRENCY=1, -w 1).")


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

    gevent.spawn(watch_for_quit)
