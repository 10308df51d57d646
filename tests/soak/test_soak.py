"""The bounded soak of CI (one minute; PROTOFLASK_SOAK_SECONDS), against gunicorn
in a subprocess so that RSS and greenlets are the server's alone."""

from __future__ import annotations

import os

import pytest

from ..hardening_support import Live
from . import run_soak
from .check import settle_and_check

SECONDS = float(os.environ.get("PROTOFLASK_SOAK_SECONDS", "60"))


@pytest.mark.soak
@pytest.mark.timeout(SECONDS + 180)
def test_soak_cycles_thousands_of_rounds_and_leaves_nothing_behind():
    live = Live("gunicorn", replayWindowTime=2000, maxConnections=2000)
    try:
        figures = run_soak(live.base_url, live.token, SECONDS, workers=4,
                           report=print)
        problems = settle_and_check(live.base_url, figures)
    finally:
        live.stop()
    print("\n" + figures.table())
    assert figures.rounds >= 300, f"only {figures.rounds} rounds ran"
    assert figures.resumes > 0 and figures.tool_calls > 0
    assert not problems, problems
