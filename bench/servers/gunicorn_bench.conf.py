"""gunicorn settings for the bare gunicorn baselines (not protoflask's gunicorn.conf.py)."""

import os

worker_class = "gevent"
workers = 1
worker_connections = int(os.environ.get("MAX_CONNECTIONS", "20000")) + 100
backlog = 4096
keepalive = 5
graceful_timeout = 2
accesslog = None
loglevel = "warning"
