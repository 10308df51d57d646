"""gunicorn settings: ``gunicorn -k gevent wsgi:app`` picks this file up by itself."""

import os

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
    """Refuse several workers: each would hold its own sessions in memory, so a resume, a
    follow-up POST or send_message landing on another worker would silently miss them.
    (A shared Redis-backed session hub is what several workers need; it is not built yet.)"""
    if server.cfg.workers > 1:
        raise SystemExit(
            f"protoflask: {server.cfg.workers} workers configured, but sessions live in each "
            "worker's memory, so requests landing on another worker would not find them. Run "
            "one worker per process (WEB_CONCURRENCY=1, -w 1) and scale with more processes "
            "behind a load balancer only once a shared session store is configured.")


def _protoserver(worker):
    app = worker.wsgi
    extensions = getattr(app, "extensions", {})
    return extensions.get("protoflask")


def post_worker_init(worker):
    """Start protoflask's timers in the worker and close sessions when it is told to quit."""
    server = _protoserver(worker)
    if server is None:
        return
    server.serving_started()

    def watch_for_quit():
        while worker.alive:
            gevent.sleep(0.25)
        server.serving_stopped()

    gevent.spawn(watch_for_quit)
