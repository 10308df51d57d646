"""Interop: clients protoflask did not write, against a real server.

Each client here is somebody else's implementation of HTTP, SSE or WebSocket: Chromium's
native ``WebSocket`` and ``EventSource``, ``curl``, Python's ``httpx`` + ``httpx-sse``,
Node's ``ws`` and ``eventsource`` packages, and nginx in front of protoflask. The system
programs (chromium, curl, node >= 20, nginx) are skipped with a reason when absent, except
in CI: ``.ci/run`` sets PROTOFLASK_REQUIRE_INTEROP=1 (and PROTOFLASK_REQUIRE_BROWSER=1),
and there a missing one fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE / "node"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
#: No heartbeat PING during a test unless it asks for one (the clients answer them, but
#: a test's expected message list stays exact).
QUIET = {"heartbeatInterval": 600000, "heartbeatTimeout": 600000}


def missing(reason: str, flag: str = "PROTOFLASK_REQUIRE_INTEROP") -> None:
    """Skip for ``reason``, or fail when CI (``flag`` = 1) says the program must be there."""
    if os.environ.get(flag) == "1":
        pytest.fail(f"{reason} and {flag}=1")
    pytest.skip(reason)


def need_program(name: str, package: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}")
                                  else None)
    if path is None:
        missing(f"{name} is absent (install the Debian package {package!r})")
    assert path is not None
    return path


def need_chromium() -> str:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("PROTOFLASK_REQUIRE_BROWSER") == "1":
            missing(f"{CHROMIUM} is absent", "PROTOFLASK_REQUIRE_BROWSER")
        missing(f"{CHROMIUM} is absent (install the Debian package 'chromium')")
    return CHROMIUM


def need_node() -> str:
    """node >= 20 with tests/interop/node's packages (npm ci when node_modules is absent)."""
    node = need_program("node", "nodejs")
    version = subprocess.run([node, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        missing(f"node {version} is older than 20")
    if not (NODE_DIR / "node_modules" / "ws").is_dir() or \
            not (NODE_DIR / "node_modules" / "eventsource").is_dir():
        npm = need_program("npm", "npm")
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            missing(f"npm ci in {NODE_DIR} failed: {proc.stderr[-2000:]}")
    return node


class PageServer:
    """Static HTML pages on a port of their own: another origin than the protoflask
    server's, so the browser applies CORS and sends Origin on the WebSocket."""

    def __init__(self, pages: dict[str, str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = pages.get(self.path.split("?", 1)[0])
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def page_server() -> Iterator[Callable[[dict[str, str]], PageServer]]:
    made: list[PageServer] = []

    def make(pages: dict[str, str]) -> PageServer:
        server = PageServer(pages)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


class LineProcess:
    """A subprocess whose stdout is read line by line by a thread; ``expect`` waits for a
    line matching a predicate (with a deadline) and returns it."""

    def __init__(self, args: list[str], *, stdin: bool = False, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        import queue

        self.args = args
        self.lines: list[str] = []
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self._stderr = tempfile.TemporaryFile()  # never a pipe nobody drains
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE if stdin else None,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     cwd=cwd, env=env)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
        self._queue.put(None)

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def expect(self, predicate: Callable[[str], bool], within: float = 10.0,
               what: str = "a line") -> str:
        import queue
        import time

        from ..support import timeout

        deadline = time.monotonic() + timeout(within)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.args[0]}: no {what} within {within}s; "
                                     f"last lines: {self.lines[-10:]}; "
                                     f"stderr: {self.stderr_so_far()}")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"{self.args[0]} ended (exit {self.proc.wait()}) "
                                     f"before {what}; last lines: {self.lines[-10:]}; "
                                     f"stderr: {self.stderr_so_far()}")
            self.lines.append(line)
            if predicate(line):
                return line

    def stderr_so_far(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


@pytest.fixture
def processes() -> Iterator[Callable[..., LineProcess]]:
    made: list[LineProcess] = []

    def start(args: list[str], **kwargs: Any) -> LineProcess:
        proc = LineProcess(args, **kwargs)
        made.append(proc)
        return proc

    yield start
    for proc in made:
        proc.stop()
