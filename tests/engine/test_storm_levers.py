"""What a serving worker does for reconnect storms (issue 29), on the engine alone."""

from __future__ import annotations

import gc

from protoflask.engine import SERVING_GC_THRESHOLDS

from .test_engine import Harness


def test_serving_spreads_full_collections_unless_the_process_tuned_its_own() -> None:
    before = gc.get_threshold()
    engines = []
    try:
        gc.set_threshold(700, 10, 10)  # Python's defaults
        engines.append(Harness().engine)
        engines[-1].ensure_running()
        assert gc.get_threshold() == SERVING_GC_THRESHOLDS
        gc.set_threshold(500, 5, 5)  # an application's own tuning is left alone
        engines.append(Harness().engine)
        engines[-1].ensure_running()
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        for engine in engines:
            engine.stop_timers()
        gc.set_threshold(*before)
