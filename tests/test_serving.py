"""The embedded server's serving glue (protoflask/serving.py)."""

from __future__ import annotations

import gc

from protoflask import ProtoServer

SECRET = "test-secret-that-is-long-enough-for-hs256!"


def test_the_embedded_server_applies_the_gc_policy_once_listening() -> None:
    """What exists once the server listens is frozen out of later full collections
    (serving.freeze_startup_heap), as gunicorn's worker does once its app is loaded."""
    gc.unfreeze()
    server = ProtoServer(config={"jwtSecret": SECRET, "host": "127.0.0.1", "port": 0})
    server.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        server.stop()
