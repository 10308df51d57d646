"""gunicorn settings: ``gunicorn wsgi:app`` (or ``gunicorn -k gevent wsgi:app``) picks this
file up by itself. What protoflask does under gunicorn (the drain on SIGTERM, the turn
every request gives the other greenlets, the checks before the workers start) is its
worker class, protoflask/gunicorn_worker.py; this file holds the settings."""

import os

from protoflask.gunicorn_worker import gevent_means_protoflask

worker_class = "protoflask.gunicorn_worker.GeventWorker"
# tokens kept out of gunicorn's access and error logs (docs/OPERATIONS.md)
logger_class = "protoflask.gunicorn_worker.RedactingLogger"
# -k gevent on the command line overrides worker_class: with this file it still means
# protoflask's gevent worker
on_starting = gevent_means_protoflask
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
# the drain gives running tools this less protoflask.gunicorn_worker.CLOSE_MARGIN
graceful_timeout = 10
# gunicorn's gevent worker reads every request head (the first one too) within keepalive
# seconds, or closes the connection: this bounds a header slowloris.
keepalive = 5
# Seconds a worker may go without a heartbeat (a blocked event loop) before it is killed.
timeout = 30
