"""gunicorn settings: ``gunicorn -k gevent wsgi:app`` picks this file up by itself."""

import os
import sys

import gevent

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
    """Start protoflask's timers in the worker and close sessions when it is told to quit."""
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
            gevent.sleep(0.25)
        server.serving_stopped()

    gevent.spawn(watch_for_quit)
