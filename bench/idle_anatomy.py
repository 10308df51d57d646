"""Where an idle WebSocket session's memory goes, measured inside a real worker (issue 29).

    python bench/idle_anatomy.py [--n 2000] [--root CHECKOUT] [--heartbeat-ms 2000]
                                 [--rounds 2] [--frames 12] [--top 25] [--json OUT]

Starts the bench's protoflask server (gunicorn, one gevent worker, the environment of
bench/run.py's ``protoflask`` spec) from ``--root`` (default: this checkout) with this
file as its gunicorn config: it loads the checkout's own gunicorn.conf.py and adds a
``post_worker_init`` hook that starts tracemalloc in the worker and serves a probe on a
local port. bench/storm.py then opens ``--n`` sessions (upgrade, HELLO, its reply), one
user each, and holds them. The probe, in the worker, compares the heap after the storm
(and again after ``--rounds`` heartbeat rounds) with the heap after a warm-up storm:

- tracemalloc's growth per session, grouped by the innermost frame, and by the innermost
  frame in protoflask's own code (what of protoflask's made the allocation);
- the gc-tracked objects per session by type (their ``__dict__``s are not read: reading
  one makes it, where Python 3.11 keeps an instance's attributes without a dict);
- the worker's RSS growth per session beside the traced bytes.

tracemalloc slows the storm and adds its own bookkeeping to the RSS: read the RSS from
bench/run.py's storm memory row, and the shares from here.
"""

from __future__ import annotations

import os
import sys

if __name__ != "__main__" and os.environ.get("ANATOMY_PORT"):
    # -- loaded by gunicorn as its config file: the checkout's settings, plus the probe --
    import runpy

    globals().update({k: v for k, v in runpy.run_path(
        os.path.join(os.environ["ANATOMY_ROOT"], "gunicorn.conf.py")).items()
        if not k.startswith("__")})

    def post_worker_init(worker):  # type: ignore[no-untyped-def]
        import tracemalloc

        import gevent
        from gevent.server import StreamServer

        tracemalloc.start(int(os.environ.get("ANATOMY_FRAMES", "12")))
        probe = _Probe()

        def handle(sock, _addr):  # type: ignore[no-untyped-def]
            f = sock.makefile("rwb")
            for line in f:
                cmd = line.decode().split()
                out = probe.command(cmd)
                f.write((json_dumps(out) + "\n").encode())
                f.flush()

        server = StreamServer(("127.0.0.1", int(os.environ["ANATOMY_PORT"])), handle)
        gevent.spawn(server.serve_forever)


def json_dumps(obj):  # type: ignore[no-untyped-def]
    import json

    return json.dumps(obj, default=str)


class _Probe:
    """The worker's side: a mark (the heap after the warm-up), then reports against it."""

    def __init__(self) -> None:
        self.base = None
        self.base_types: dict[str, list[int]] = {}
        self.base_rss = 0

    def command(self, cmd):  # type: ignore[no-untyped-def]
        if cmd[0] == "mark":
            return self.mark()
        if cmd[0] == "report":
            return self.report(int(cmd[1]), int(cmd[2]))
        return {"error": f"unknown {cmd}"}

    @staticmethod
    def _rss() -> int:
        import resource

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    @staticmethod
    def _census():  # type: ignore[no-untyped-def]
        import gc
        import sys as _sys

        gc.collect()
        types: dict[str, list[int]] = {}
        for o in gc.get_objects():
            t = type(o)
            name = f"{t.__module__}.{t.__qualname__}"
            row = types.setdefault(name, [0, 0])
            row[0] += 1
            row[1] += _sys.getsizeof(o)  # not its __dict__: reading one makes it
        return types

    def mark(self):  # type: ignore[no-untyped-def]
        import gc
        import tracemalloc

        gc.collect()
        self.base = tracemalloc.take_snapshot()
        self.base_rss = self._rss()
        self.base_types = self._census()
        return {"pid": os.getpid(), "rss": self.base_rss,
                "traced": tracemalloc.get_traced_memory()[0]}

    def report(self, n: int, top: int):  # type: ignore[no-untyped-def]
        import gc
        import tracemalloc

        gc.collect()
        snap = tracemalloc.take_snapshot()
        rss = self._rss()
        types = self._census()
        assert self.base is not None
        filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
        snap, base = snap.filter_traces(filters), self.base.filter_traces(filters)
        total = sum(s.size_diff for s in snap.compare_to(base, "filename"))
        by_line = [(f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                    s.size_diff / n, s.count_diff / n)
                   for s in snap.compare_to(base, "lineno")[:top]]
        by_own: dict[str, list[float]] = {}
        grown = snap.compare_to(base, "traceback")
        for s in grown:
            key = self._own(s.traceback)
            row = by_own.setdefault(key, [0, 0])
            row[0] += s.size_diff
            row[1] += s.count_diff
        own = sorted(((k, v[0] / n, v[1] / n) for k, v in by_own.items()),
                     key=lambda r: -abs(r[1]))[:top]
        objects = []
        for name, (count, size) in types.items():
            b = self.base_types.get(name, [0, 0])
            if count - b[0] >= n // 2:
                objects.append((name, (count - b[0]) / n, (size - b[1]) / n))
        objects.sort(key=lambda r: -r[2])
        return {"pid": os.getpid(), "n": n, "rss_per_session": (rss - self.base_rss) / n,
                "traced_per_session": total / n, "by_line": by_line, "by_own_frame": own,
                "objects": objects[:top]}

    @staticmethod
    def _own(tb) -> str:  # type: ignore[no-untyped-def]
        """The innermost frame in protoflask's own code (else the innermost), with the
        innermost frame beside it when they differ."""
        inner = tb[-1]  # a traceback runs from the oldest frame to the innermost
        for fr in reversed(tb):
            if "/protoflask/" in fr.filename and "/site-packages/" not in fr.filename:
                name = fr.filename.split("/protoflask/", 1)[1]
                if fr is inner:
                    return f"protoflask/{name}:{fr.lineno}"
                leaf = inner.filename.rsplit("/", 1)[-1]
                return f"protoflask/{name}:{fr.lineno} <- {leaf}:{inner.lineno}"
        leaf = "/".join(inner.filename.rsplit("/", 2)[-2:])
        return f"(outside) {leaf}:{inner.lineno}"


def main() -> int:
    import argparse
    import json
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--root", default=str(here.parent.parent))
    p.add_argument("--heartbeat-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json")
    args = p.parse_args()
    root = Path(args.root).resolve()
    sys.path.insert(0, str(here.parent))
    from run import SECRET  # noqa: E402

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    port, probe_port = free_port(), free_port()
    env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
           "ENABLE_COMPRESSION": "false", "ECHO_MESSAGES": "false", "RATE_LIMIT": "0",
           "MAX_CONNECTIONS": str(2 * args.n + 1000),
           "MAX_CONNECTIONS_PER_USER": str(2 * args.n + 1000), "WEB_CONCURRENCY": "1",
           "HEARTBEAT_INTERVAL": str(args.heartbeat_ms), "PYTHONPATH": str(root),
           "ANATOMY_PORT": str(probe_port), "ANATOMY_ROOT": str(root),
           "ANATOMY_FRAMES": str(args.frames)}
    logdir = Path(tempfile.mkdtemp(prefix="anatomy-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(here), "--bind", f"127.0.0.1:{port}",
         "--chdir", str(root), "wsgi:app"], env=env, cwd=str(root),
        stdout=open(logdir / "out", "w"), stderr=open(logdir / "err", "w"))

    def ask(line: str):  # type: ignore[no-untyped-def]
        with socket.create_connection(("127.0.0.1", probe_port), timeout=600) as s:
            f = s.makefile("rwb")
            f.write((line + "\n").encode())
            f.flush()
            return json.loads(f.readline())

    def storm(n: int):  # type: ignore[no-untyped-def]
        cfg = {"baseUrl": f"http://127.0.0.1:{port}", "mode": "ws", "connections": n,
               "proto": "proto", "inflight": 100, "secret": SECRET, "replay": 10,
               "timeout": max(120, n / 20)}
        proc = subprocess.Popen([sys.executable, str(here.parent / "storm.py"),
                                 json.dumps(cfg)], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True, cwd=str(here.parent))
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        return proc, ready

    def close(proc) -> None:  # type: ignore[no-untyped-def]
        proc.stdin.write("close\n")
        proc.stdin.flush()
        proc.stdout.readline()
        proc.wait(timeout=60)

    try:
        for _ in range(100):
            try:
                ask("noop")
                break
            except OSError:
                time.sleep(0.2)
        warm, _ = storm(min(100, args.n))
        close(warm)
        time.sleep(1.0)
        base = ask("mark")
        proc, ready = storm(args.n)
        time.sleep(0.5)
        reports = {"after the storm": ask(f"report {ready.get('connected') or args.n} "
                                          f"{args.top}")}
        if args.rounds:
            time.sleep(args.rounds * args.heartbeat_ms / 1000 + 1.0)
            reports[f"after {args.rounds} heartbeat rounds"] = ask(
                f"report {ready.get('connected') or args.n} {args.top}")
        close(proc)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(logdir, ignore_errors=True)
    print(f"root {root}, {args.n} sessions, worker pid {base['pid']}, load "
          f"{os.getloadavg()[0]:.1f}")
    for when, r in reports.items():
        print(f"\n== {when}: RSS +{r['rss_per_session']:.0f} B/session (tracemalloc's own "
              f"tables included), traced +{r['traced_per_session']:.0f} B/session")
        print("-- by innermost frame (B/session, allocations/session)")
        for where, size, count in r["by_line"]:
            print(f"  {size:8.0f} {count:6.2f}  {where}")
        print("-- by the innermost protoflask frame")
        for where, size, count in r["by_own_frame"]:
            print(f"  {size:8.0f} {count:6.2f}  {where}")
        print("-- gc-tracked objects per session (count, getsizeof B)")
        for name, count, size in r["objects"]:
            print(f"  {count:6.2f} {size:8.0f}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
