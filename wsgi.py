"""WSGI entry point: ``gunicorn -k gevent wsgi:app`` (configuration from the environment)."""

from protoflask.logs import configure_logging
from protoflask.server import create_app

configure_logging()
app = create_app()
