"""What the callgrind counters share: gunicorn's worker started under valgrind's
callgrind, and the worker's totals read back (bench/worker_instructions.py,
bench/storm_instructions.py). No gevent here: a counter may run without it."""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def gunicorn_under_callgrind(root: Path, port: int, env: dict[str, str], out: str,
                             app: str = "wsgi:app", instr_at_start: bool = True,
                             extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """``gunicorn -c root/gunicorn.conf.py app`` (one worker, the Python request parser:
    valgrind does not know the C one's instructions) under callgrind, children followed,
    each process's counts in ``out/cg.<pid>``; returns once /health answers."""
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes"]
    if not instr_at_start:
        cmd.append("--instr-atstart=no")
    cmd += [f"--callgrind-out-file={out}/cg.%p", sys.executable, "-m", "gunicorn",
            "-c", str(root / "gunicorn.conf.py"), "--chdir", str(root), "--timeout", "900",
            "--http-parser", "python", *extra, "--bind", f"127.0.0.1:{port}", app]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(f"{out}/log", "w"))
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).read()
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit(f"gunicorn under callgrind did not start: see {out}/log") \
                    from None
            time.sleep(1)


def totals(pattern: str, label: str = "(?:summary|totals)") -> list[int]:
    """The instruction totals of the callgrind files matching ``pattern``: the first line
    starting ``label:`` of each (a worker whose instrumentation was switched on late has
    ``summary: 0`` in its header, so its count is read from ``totals``)."""
    found = []
    for path in glob.glob(pattern):
        m = re.search(rf"^{label}: (\d+)", Path(path).read_text(), re.M)
        if m:
            found.append(int(m.group(1)))
    return found


def events(pattern: str) -> list[dict[str, int]]:
    """Every event of the callgrind files matching ``pattern``, by name (``Ir``, and with
    the cache and branch simulation ``D1mr``, ``Bcm``...): each file's first ``summary:``
    or ``totals:`` line against its ``events:`` line."""
    found = []
    for path in glob.glob(pattern):
        text = Path(path).read_text()
        names = re.search(r"^events: (.*)$", text, re.M)
        counts = re.search(r"^(?:summary|totals): (.*)$", text, re.M)
        if names and counts:
            found.append(dict(zip(names.group(1).split(), map(int, counts.group(1).split()),
                                  strict=True)))
    return found
