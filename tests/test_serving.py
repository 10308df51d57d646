"""The embedded server's serving glue (protoflask/serving.py)."""

from __future__ import annotations

import gc

from protoflask import ProtoServer, serving

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


def test_serving_spreads_full_collections_unless_the_process_tuned_its_own() -> None:
    """Issue 29: a storm of 10,000 sessions made nine full collections of all of them
    with Python's thresholds; a serving process takes SERVING_GC_THRESHOLDS instead, but
    an application's own tuning is left alone."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # Python's defaults
        serving.freeze_startup_heap()
        assert gc.get_threshold() == serving.SERVING_GC_THRESHOLDS
        gc.set_threshold(500, 5, 5)
        serving.freeze_startup_heap()
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
