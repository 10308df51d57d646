"""python -m tests.soak --minutes 30: the long soak against gunicorn, with a report.

Runs gunicorn -k gevent on tests/fixtures/hardening_app.py (with /debug/vitals on) in a
subprocess, cycles rounds over every transport for the given time, lets the kept
sessions expire, and prints the figures as the Markdown table docs/RELIABILITY.md
quotes. Exits non-zero if a message was lost, a round failed, or the server did not
come back to its baseline.
"""

from __future__ import annotations

import argparse
import sys

from . import run_soak
from .check import settle_and_check
from ..hardening_support import Live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    live = Live("gunicorn", replayWindowTime=2000, maxConnections=2000)
    try:
        figures = run_soak(live.base_url, live.token, args.minutes * 60, args.workers,
                           report=lambda line: print(line, flush=True))
        problems = settle_and_check(live.base_url, figures)
    finally:
        live.stop()
    print(figures.table())
    for error in figures.errors[:20]:
        print("error:", error)
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
