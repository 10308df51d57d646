"""protoflask's own Flask app (ProtoServer without an app, serving itself) logs a view's
exception once: its app logger is not the logger gevent's server writes errors to, or
Flask's default handler (which writes to wsgi.errors) and that logger would feed each
other until RecursionError. Run in a fresh interpreter: pytest's log capture would stop
Flask from installing the default handler at all."""

from __future__ import annotations

import subprocess
import sys

from ..support import ROOT, SECRET, timeout

SCRIPT = f"""
import requests
from protoflask import ProtoServer

server = ProtoServer({{"port": 0, "host": "127.0.0.1", "jwtSecret": {SECRET!r},
                      "enableLogging": False}})

@server.app.get("/boom")
def boom():
    raise RuntimeError("boom from a view")

server.start()
try:
    print("status", requests.get(f"http://127.0.0.1:{{server.port}}/boom", timeout=5).status_code)
finally:
    server.stop()
"""


def test_a_failing_view_is_one_500_and_one_logged_traceback():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout(30))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "status 500" in done.stdout
    assert "RecursionError" not in done.stderr
    assert done.stderr.count("RuntimeError: boom from a view") == 1, done.stderr[-2000:]
