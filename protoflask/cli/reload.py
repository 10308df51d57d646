"""`protoflask serve --reload`: run the server in a child process (the same command
without --reload) and start it again whenever a Python file under the current directory
changes. With --dev the children share one random secret, so a token keeps working
across restarts."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

#: How often the files are looked at (seconds).
POLL = 0.5
SKIPPED_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache",
                ".pytest_cache", ".ruff_cache"}


def _snapshot(root: Path) -> dict[str, float]:
    found: dict[str, float] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                try:
                    found[path] = os.stat(path).st_mtime
                except OSError:
                    pass
    return found


def run_reloading(dev: bool) -> int:
    argv = [a for a in sys.argv[1:] if a != "--reload"]
    command = [sys.executable, "-m", "protoflask", *argv]
    env = dict(os.environ)
    if dev and not env.get("JWT_SECRET"):
        env["JWT_SECRET"] = secrets.token_urlsafe(32)
    root = Path.cwd()
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    while True:
        print(f"protoflask serve --reload: watching {root}", file=sys.stderr, flush=True)
        child = subprocess.Popen(command, env=env)
        seen = _snapshot(root)
        changed = False
        while not stop and child.poll() is None:
            time.sleep(POLL)
            now = _snapshot(root)
            if now != seen:
                changed = True
                break
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if stop:
            return 0
        if not changed:  # the server ended by itself: wait for a fix, then start again
            print(f"protoflask serve --reload: the server exited with {child.returncode}; "
                  "waiting for a change", file=sys.stderr, flush=True)
            while not stop and _snapshot(root) == seen:
                time.sleep(POLL)
            if stop:
                return 0
        print("protoflask serve --reload: a file changed, restarting", file=sys.stderr,
              flush=True)
