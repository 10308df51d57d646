"""protoflask benchmarks, side by side with bare WebSocket echo servers, in one run.

    python bench/run.py                 # everything (~6 min on 2 cores), table + JSON
    python bench/run.py --quick         # a few-second smoke of the same
    python bench/run.py --only ping --servers protoflask,flask-sock --levels 100
    python bench/run.py --profile       # also py-spy the protoflask worker under PING load
    python bench/run.py --only storm --storm 2000 --rounds 3   # reconnect storms (issue 29)

Servers run pinned to the first allowed CPU, the load generator to the second (skipped with
a warning on one CPU, or with --no-pin). Servers:

    protoflask          gunicorn -c gunicorn.conf.py wsgi:app (gevent worker, full protocol)
    flask-sock          bare Flask + flask-sock echo under gunicorn -k gevent -w 1
    gevent-simple-ws    bare gevent WSGIServer + simple-websocket echo
    websockets-asyncio  bare `websockets` asyncio echo
    gevent-sansio       bare gevent StreamServer + `websockets` sans-I/O echo (the ceiling)
    protoflask-redis    protoflask with REDIS_URL (BENCH_REDIS_URL), one worker
    protoflask-redis-2w the same with two workers (unpinned: they share both cores)

    python bench/run.py --only ping --servers protoflask,protoflask-redis,protoflask-redis-2w

The load generator is bench/loadgen.c (compiled on first use into bench/build/); see
docs/PERFORMANCE.md for why, and the "generator check" section of a full run for the
numbers. --generator node|python picks the alternatives (bench/loadgen.mjs,
bench/loadgen_py.py). Results: a table on stdout and bench/results/<timestamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import storm_rows

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SERVERS_DIR = BENCH / "servers"
SECRET = "bench-secret-bench-secret-bench-secret!!"
WS_PATH = "/proto/websocket"

# -- servers ------------------------------------------------------------------------------


@dataclass
class ServerSpec:
    name: str
    label: str
    proto: str  # "proto": the full protocol; "echo": a bare echo
    gunicorn_app: str | None = None  # module:app run by gunicorn's gevent worker
    gunicorn_conf: Path | None = None
    chdir: Path = ROOT
    script: Path | None = None  # or: a script taking --fd
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 1  # gunicorn workers; with more than one, none is pinned or CPU-measured
    ready: str = "ws"  # "ws": up once the WebSocket upgrade answers 101; "http": any answer

    def command(self, fd: int) -> list[str]:
        if self.gunicorn_app:
            return [sys.executable, "-m", "gunicorn", "-c", str(self.gunicorn_conf),
                    "--bind", f"fd://{fd}", "--chdir", str(self.chdir), self.gunicorn_app]
        assert self.script is not None
        return [sys.executable, str(self.script), "--fd", str(fd)]


def server_specs(max_connections: int) -> dict[str, ServerSpec]:
    limit = str(max_connections)
    specs = [
        ServerSpec("protoflask", "protoflask (full protocol)", "proto",
                   gunicorn_app="wsgi:app", gunicorn_conf=ROOT / "gunicorn.conf.py", chdir=ROOT,
                   env={"JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
                        "ENABLE_COMPRESSION": "false", "ECHO_MESSAGES": "false", "RATE_LIMIT": "0",
                        # every bench connection is the same user: without this the
                        # per-user cap (maxConnections // 10) refuses idle sessions
                        "MAX_CONNECTIONS": limit, "MAX_CONNECTIONS_PER_USER": limit,
                        "WEB_CONCURRENCY": "1"}),
        ServerSpec("flask-sock", "Flask + flask-sock echo (gunicorn gevent -w 1)", "echo",
                   gunicorn_app="flask_sock_echo:app",
                   gunicorn_conf=SERVERS_DIR / "gunicorn_bench.conf.py", chdir=SERVERS_DIR,
                   env={"MAX_CONNECTIONS": limit}),
        ServerSpec("gevent-simple-ws", "gevent + simple-websocket echo", "echo",
                   script=SERVERS_DIR / "gevent_simple_ws_echo.py"),
        ServerSpec("websockets-asyncio", "websockets asyncio echo", "echo",
                   script=SERVERS_DIR / "websockets_asyncio_echo.py"),
        ServerSpec("gevent-sansio", "gevent + websockets sans-I/O echo", "echo",
                   script=SERVERS_DIR / "gevent_sansio_echo.py"),
    ]
    # Scale-out on Redis (not in the default set: they need a Redis, BENCH_REDIS_URL)
    for name, label, workers in (("protoflask-redis", "protoflask on Redis, 1 worker", 1),
                                 ("protoflask-redis-2w", "protoflask on Redis, 2 workers", 2)):
        specs.append(ServerSpec(
            name, label, "proto", gunicorn_app="wsgi:app", gunicorn_conf=ROOT / "gunicorn.conf.py",
            chdir=ROOT, workers=workers,
            env={**specs[0].env, "WEB_CONCURRENCY": str(workers), "REDIS_URL": REDIS_URL,
                 "REDIS_PREFIX": f"protoflask-bench-{os.getpid()}-{name}"}))
    before = os.environ.get("BENCH_BEFORE")
    if before:  # --before: the same server from another checkout, side by side
        root = Path(before).resolve()
        specs.append(ServerSpec(
            "protoflask-before", f"protoflask at {root.name} (before)", "proto",
            gunicorn_app="wsgi:app", gunicorn_conf=root / "gunicorn.conf.py", chdir=root,
            env={**specs[0].env, "PYTHONPATH": str(root)}))
    return {s.name: s for s in specs}


#: Not a server the ping bench can drive: measure_http starts it for its floor row.
FLOOR_SPEC = ServerSpec("gunicorn-post-floor", "bare WSGI app under gunicorn gevent (POST floor)",
                        "floor", gunicorn_app="gunicorn_post_floor:app",
                        gunicorn_conf=SERVERS_DIR / "gunicorn_bench.conf.py", chdir=SERVERS_DIR,
                        ready="http")

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
DEFAULT_SERVERS = ["protoflask", "flask-sock", "gevent-simple-ws", "websockets-asyncio",
                   "gevent-sansio"]


def bench_token() -> str:
    import jwt

    now = int(time.time())
    return jwt.encode({"sub": "bench", "iat": now, "exp": now + 24 * 3600}, SECRET,
                      algorithm="HS256")


def proc_children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def pin_process(pid: int, cpu: int) -> None:
    """Pin every thread of a process (sched_setaffinity on a pid moves one thread only)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError:
            pass


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Server:
    """One server process group, started by us, pinned, on a listening socket we pass in."""

    def __init__(self, spec: ServerSpec, cpu: int | None, logdir: Path, token: str) -> None:
        self.spec = spec
        self.cpu = cpu
        self.token = token
        self.log_path = logdir / f"{spec.name}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.pid = 0  # the process that does the work (gunicorn's worker)

    @property
    def url(self) -> str:
        query = f"?token={self.token}" if self.spec.proto == "proto" else ""
        return f"ws://127.0.0.1:{self.port}{WS_PATH}{query}"

    def start(self) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        self.port = listener.getsockname()[1]
        fd = listener.fileno()
        os.set_inheritable(fd, True)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        cmd = self.spec.command(fd)
        taskset = shutil.which("taskset") if self.cpu is not None else None
        if taskset:
            cmd = [taskset, "-c", str(self.cpu), *cmd]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, pass_fds=(fd,), env=env, cwd=str(self.spec.chdir), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        if self.cpu is not None and not taskset:
            pin_process(self.proc.pid, self.cpu)  # before gunicorn forks its worker
        listener.close()

    def wait_ready(self, timeout: float = 60) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited ({self.proc.returncode}):\n"
                                   + self.log_tail())
            try:
                if self.spec.ready == "http" and http_answers(self.port):
                    break
                if self.spec.ready == "ws" and ws_upgrade_ok(
                        self.port, self.url.split(str(self.port), 1)[1]):
                    break
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{self.spec.name} not ready after {timeout}s ({last}):\n"
                               + self.log_tail())
        self.pid = self.proc.pid
        if self.spec.gunicorn_app:
            want = self.spec.workers
            kids = proc_children(self.proc.pid)
            if len(kids) != want:
                raise RuntimeError(f"{self.spec.name}: expected {want} gunicorn workers, "
                                   f"got {kids}")
            self.pid = kids[0] if want == 1 else 0  # 0: no per-process CPU figures
            if want > 1:
                return  # several workers share both cores with the generator: unpinned
        if self.cpu is not None:  # every thread of master and worker, whatever started them
            for pid in {self.proc.pid, self.pid}:
                pin_process(pid, self.cpu)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(8)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass

    def stats(self) -> dict | None:
        if self.spec.proto != "proto":
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None


def http_answers(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        return bool(r.status)


def ws_upgrade_ok(port: int, path: str) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        return head.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"101"]


# -- load generators -------------------------------------------------------------------------


def build_c_generator() -> Path | None:
    src, out = BENCH / "loadgen.c", BENCH / "build" / "loadgen"
    if out.exists() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        return None
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_name(f"loadgen.{os.getpid()}.tmp")
    r = subprocess.run([cc, "-O2", "-o", str(tmp), str(src), "-lm"], check=False,
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"bench: compiling loadgen.c failed:\n{r.stderr}", file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, out)  # atomic: concurrent runs never execute a half-written binary
    return out


def node_generator_ready() -> bool:
    node = shutil.which("node")
    if not node:
        return False
    if not (BENCH / "node_modules" / "ws").is_dir():
        npm = shutil.which("npm")
        if not npm:
            return False
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], check=False, cwd=BENCH,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"bench: npm ci failed:\n{r.stderr[-2000:]}", file=sys.stderr)
            return False
    return True


class Generator:
    def __init__(self, kind: str, cpu: int | None) -> None:
        self.kind = kind
        self.cpu = cpu
        self.c_binary: Path | None = None
        if kind == "c":
            self.c_binary = build_c_generator()
            if self.c_binary is None:
                raise RuntimeError("no C compiler")
        elif kind == "node" and not node_generator_ready():
            raise RuntimeError("node or its ws package is unavailable")

    def supports(self, mode: str) -> bool:
        if self.kind == "python":
            return mode == "ping"
        return self.kind == "c" or mode != "batch"

    def command(self, cfg: dict[str, Any]) -> list[str]:
        if self.kind == "c":
            assert self.c_binary is not None
            args = [str(self.c_binary)]
            names = {"url": "--url", "mode": "--mode", "proto": "--proto",
                     "connections": "--connections", "warmup": "--warmup",
                     "seconds": "--seconds", "serverPid": "--server-pid", "parts": "--parts",
                     "pipeline": "--pipeline", "batch": "--batch",
                     "connectConcurrency": "--connect-concurrency"}
            for key, flag in names.items():
                if key in cfg and cfg[key] is not None:
                    args += [flag, str(cfg[key])]
            return args
        if self.kind == "node":
            return [shutil.which("node") or "node", str(BENCH / "loadgen.mjs"), json.dumps(cfg)]
        return [sys.executable, str(BENCH / "loadgen_py.py"), json.dumps(cfg)]

    def popen(self, cfg: dict[str, Any], stdin: bool = False) -> subprocess.Popen:
        # No preexec_fn (unsafe with threads): generators inherit this process's CPU
        # affinity, which main() set to the generator's CPU.
        return subprocess.Popen(
            self.command(cfg), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True, cwd=str(BENCH))


def pick_generator(requested: str, cpu: int | None) -> Generator:
    order = [requested] if requested != "auto" else ["c", "node", "python"]
    errors = []
    for kind in order:
        try:
            return Generator(kind, cpu)
        except RuntimeError as exc:
            errors.append(f"{kind}: {exc}")
    raise SystemExit("bench: no usable load generator (" + "; ".join(errors) + ")")


def reap(proc: subprocess.Popen) -> None:
    """Wait for a generator that has given its result; kill one that hangs on."""
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class LineReader:
    """The generator's stdout, line by line, read on a thread (so the bar keeps moving)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(proc.stderr,), daemon=True).start()

    @staticmethod
    def _pump(stream, q) -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    def _drain(self, stream) -> None:
        for line in stream:
            self.stderr.append(line)

    def next_json(self, progress: Progress, deadline: float) -> dict | None:
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                progress.tick()
                continue
            if line is None:
                return None
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise TimeoutError("the load generator did not answer in time")


# -- progress ---------------------------------------------------------------------------------


class Progress:
    """A tqdm bar in estimated seconds; plain lines on stderr without tqdm."""

    def __init__(self, total: float, enabled: bool = True) -> None:
        self.total = total
        self.done = 0.0  # estimate of finished steps
        self.step_est = 0.0
        self.step_start = time.monotonic()
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=round(total), unit="s", file=sys.stderr, dynamic_ncols=True,
                                bar_format="{desc:<44.44}|{bar}| {n:.0f}/{total:.0f}s est "
                                           "[{elapsed}<{remaining}]")
            except ImportError:
                pass

    def step(self, name: str, estimate: float) -> None:
        self.done += self.step_est
        self.step_est = estimate
        self.step_start = time.monotonic()
        if self.bar is not None:
            self.bar.set_description_str(name)
            self.bar.n = min(self.total, self.done)
            self.bar.refresh()
        elif self.enabled:
            print(f"[{self.done:5.0f}/{self.total:.0f}s est] {name}", file=sys.stderr, flush=True)

    def tick(self) -> None:
        if self.bar is not None:
            elapsed = min(self.step_est, time.monotonic() - self.step_start)
            self.bar.n = min(self.total, self.done + elapsed)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.n = self.total
            self.bar.close()


# -- the bench -----------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.token = bench_token()
        self.specs = server_specs(args.max_connections)
        self.logdir = Path(tempfile.mkdtemp(prefix="protoflask-bench-"))
        self.server_cpu, self.gen_cpu = choose_cpus(args.no_pin)
        self.generator = pick_generator(args.generator, self.gen_cpu)
        self.servers: dict[str, Server] = {}
        self.progress: Progress | None = None
        self.results: dict[str, Any] = {}

    # servers
    def start_servers(self, names: list[str]) -> dict[str, Server]:
        started = {}
        for name in names:
            spec = self.specs[name]
            srv = Server(spec, self.server_cpu if spec.workers == 1 else None, self.logdir,
                         self.token)
            srv.start()
            started[name] = srv
            self.servers[f"{name}@{srv.port}"] = srv
        for srv in started.values():
            srv.wait_ready()
        return started

    def stop_all(self) -> None:
        for srv in self.servers.values():
            srv.stop()

    # one generator run
    def measure(self, server: Server, mode: str, connections: int, **extra: Any) -> dict:
        a = self.args
        cfg = {"url": server.url, "mode": mode, "proto": server.spec.proto,
               "connections": connections, "warmup": extra.pop("warmup", a.warmup),
               "seconds": extra.pop("seconds", a.seconds), "serverPid": server.pid,
               "clkTck": os.sysconf("SC_CLK_TCK"), **extra}
        proc = self.generator.popen(cfg)
        reader = LineReader(proc)
        deadline = time.monotonic() + cfg["warmup"] + cfg["seconds"] + 120
        try:
            result = reader.next_json(self.progress, deadline)
        finally:
            reap(proc)
        if result is None:
            raise RuntimeError(f"load generator failed: {''.join(reader.stderr)[-2000:]}")
        result["server"] = server.spec.name
        result["generator"] = self.generator.kind
        return result

    def hold_idle(self, server: Server, connections: int) -> dict:
        cfg = {"url": server.url, "mode": "idle", "proto": server.spec.proto,
               "connections": connections, "serverPid": server.pid,
               "connectConcurrency": self.args.connect_concurrency}
        proc = self.generator.popen(cfg, stdin=True)
        reader = LineReader(proc)
        try:
            ready = reader.next_json(self.progress, time.monotonic() + 300)
            if ready is None:
                raise RuntimeError(f"idle generator failed: {''.join(reader.stderr)[-2000:]}")
            settle_until = time.monotonic() + self.args.settle
            while time.monotonic() < settle_until:
                time.sleep(0.2)
                self.progress.tick()
            rss_after = rss_kb(server.pid)
            stats = server.stats()
            proc.stdin.write("close\n")
            proc.stdin.flush()
            final = reader.next_json(self.progress, time.monotonic() + 60) or {}
        finally:
            reap(proc)
        return {**ready, **final, "rss_after_kb": rss_after,
                "server_active_connections": (stats or {}).get("activeConnections")}


def choose_cpus(no_pin: bool) -> tuple[int | None, int | None]:
    if no_pin or not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("bench: fewer than 2 CPUs available; not pinning (numbers will be lower)",
              file=sys.stderr)
        return None, None
    return cpus[0], cpus[1]


def raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_times() -> dict[str, list[int]]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu"):
                name, *vals = line.split()
                out[name] = [int(v) for v in vals]
    return out


def busy_pct(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for name, vals in after.items():
        if name not in before:
            continue
        d = [a - b for a, b in zip(vals, before[name], strict=False)]
        total = sum(d[:8]) or 1
        idle = d[3] + d[4]
        out[name] = round(100 * (total - idle) / total, 1)
    return out


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_before": os.getloadavg()}


def ping_frame_bytes() -> int:
    seq = 12345
    nonce = (f"n{seq}" + "-" * 30)[:30]
    return len(f'{{"id":"c12-{seq}","session":"0123456789abcdef0123456789abcdef",'
               f'"seq":"{seq}","ts":"1795299967253","type":"PING","channel":"SYSTEM",'
               f'"payload":{{"nonce":"{nonce}"}}}}')


# -- profile ------------------------------------------------------------------------------------


def summarize_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    file_c: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        self_c[frames[-1]] += n
        leaf_file = re.search(r"\(([^()]*)\)$", frames[-1])
        file_c[leaf_file.group(1) if leaf_file else frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    def pct(c):
        return [(f, round(100 * n / total, 1)) for f, n in c.most_common(top)]
    return {"samples": total, "self": pct(self_c), "inclusive": pct(incl_c),
            "self_by_file": pct(file_c)}


# -- tables -----------------------------------------------------------------------------------


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(title: str, headers: list[str], rows: list[list[Any]], markdown: bool,
          note: str = "") -> str:
    cells = [[fmt(c, 2 if "ms" in h else 1) for c, h in zip(r, headers, strict=False)]
             for r in rows]
    if markdown:
        out = [f"**{title}**", "", "| " + " | ".join(headers) + " |",
               "|" + "|".join("---" for _ in headers) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in cells]
    else:
        widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
                  for i, h in enumerate(headers)]
        def line(r):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                           for i, (c, w) in enumerate(zip(r, widths, strict=False)))
        out = [title, line(headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in cells]
    if note:
        out += ["", note] if markdown else [note]
    return "\n".join(out) + "\n"


def render(results: dict[str, Any], specs: dict[str, ServerSpec], markdown: bool) -> str:
    parts = []
    def label(name):
        return specs[name].label if name in specs else name
    m = results.get("machine", {})
    parts.append(f"protoflask bench {results['started']}  ({m.get('cpus')} CPUs, "
                 f"{m.get('cpu_model')}; server CPU {results['pinning']['server_cpu']}, "
                 f"generator CPU {results['pinning']['generator_cpu']}; generator "
                 f"{results['generator']}; {results['settings']['warmup']}s warm-up + "
                 f"{results['settings']['seconds']}s measured per cell; PING frame "
                 f"{results['frame_bytes']} B)\n")
    if results.get("generator_check"):
        rows = [[r["generator"], label(r["server"]), r["connections"], r.get("rt_per_s"),
                 r.get("p99_ms"), r.get("gen_cpu_pct"), r.get("gen_us_per_op"),
                 r.get("server_cpu_pct")] for r in results["generator_check"]]
        parts.append(table("Generator check (same server, same load: which side saturates?)",
                           ["generator", "server", "conns", "rt/s", "p99 ms", "gen CPU %",
                            "gen µs/rt", "server CPU %"], rows, markdown))
    if results.get("ping"):
        rows = []
        for name, levels in results["ping"].items():
            for n, r in sorted(levels.items(), key=lambda kv: int(kv[0])):
                rows.append([label(name), int(n), r.get("rt_per_s"), r.get("p50_ms"),
                             r.get("p99_ms"), r.get("server_us_per_op"),
                             r.get("server_cpu_pct"), r.get("gen_cpu_pct"), r.get("errors")])
        rounds = results["settings"].get("rounds", 1)
        parts.append(table("PING -> PONG round trips (closed loop; echo servers echo the PING)",
                           ["server", "conns", "rt/s", "p50 ms", "p99 ms", "server µs/reply",
                            "server CPU %", "gen CPU %", "errors"], rows, markdown,
                           note=f"Each cell is the median of {rounds} rounds (all rounds in the "
                                "JSON)." if rounds > 1 else ""))
    if results.get("tool"):
        rows = [[label(n), r["connections"], r.get("rt_per_s"), r.get("p50_ms"),
                 r.get("p99_ms"), r.get("server_us_per_op"), r.get("server_cpu_pct"),
                 r.get("errors")] for n, r in results["tool"].items()]
        parts.append(table("Tool calls: TOOL_CALL echo -> TOOL_DONE",
                           ["server", "conns", "calls/s", "p50 ms", "p99 ms", "server µs/call",
                            "server CPU %", "errors"], rows, markdown))
    if results.get("stream"):
        rows = [[label(n), r["connections"], r.get("parts"), r.get("messages_per_s"),
                 r.get("p50_ms"), r.get("p99_ms"), r.get("server_us_per_op"),
                 r.get("server_cpu_pct"), r.get("errors")] for n, r in results["stream"].items()]
        parts.append(table(
            "Streaming upstream: MESSAGE_START, PART x N, END (echoMessages off)",
            ["server", "conns", "N", "client msgs/s", "burst p50 ms", "burst p99 ms",
             "server µs/msg", "server CPU %", "errors"], rows, markdown,
            note="A burst is START + N PARTs + END + a PING written at once; its PONG "
                 "confirms the server processed it; 2 bursts in flight per connection."))
    if results.get("idle"):
        rows = []
        for name, levels in results["idle"].items():
            for n, r in sorted(levels.items(), key=lambda kv: int(kv[0])):
                rows.append([label(name), int(n), r.get("held"),
                             r.get("server_active_connections"), r.get("connect_per_s"),
                             r.get("rss_base_kb", 0) / 1024, r.get("rss_after_kb", 0) / 1024,
                             r.get("kb_per_session")])
        parts.append(table(
            "Idle sessions (protoflask: handshaken with HELLO; echo servers: upgraded)",
            ["server", "sessions", "held", "server says", "connect+handshake/s", "RSS before MB",
             "RSS held MB", "KB/session"], rows, markdown,
            note="KB/session = worker RSS delta / sessions (kernel socket buffers not "
                 "included); 'server says' = protoflask's /stats activeConnections; "
                 "connect rate with "
                 f"{results['settings']['connect_concurrency']} handshakes in flight."))
    http = results.get("http_transports")
    if http is not None:
        if http.get("status") == "measured":
            rows = [[HTTP_ROW_LABELS.get(r["transport"], r["transport"]), r["connections"],
                     r.get("batch"), r.get("messages_per_s"),
                     r.get("p50_ms"), r.get("p99_ms"), r.get("server_us_per_op"),
                     r.get("server_cpu_pct"), r.get("gen_cpu_pct"), r.get("errors")]
                    for r in http["results"]]
            note = ("Each session sends a batch of PINGs at once (one WebSocket write / one "
                    "NDJSON POST; full duplex: one chunk of the stream's own request body) and "
                    "waits for all their PONGs downstream; msgs/s = PONGs received per "
                    "second. The floor row sends the SSE row's POSTs to a "
                    "bare WSGI app under gunicorn (no downstream; msgs/s = messages in the "
                    "POSTs answered): gunicorn's own cost of a POST, per message.")
            if http.get("failures"):
                note += " Failed: " + "; ".join(http["failures"])
            parts.append(table("Downstream throughput: WebSocket, SSE, HTTP stream (protoflask)",
                               ["transport", "conns", "batch", "PONGs/s", "batch p50 ms",
                                "batch p99 ms", "server µs/msg", "server CPU %", "gen CPU %",
                                "errors"], rows, markdown, note=note))
        else:
            parts.append(("**SSE / HTTP stream downstream throughput**\n\n" if markdown else
                          "SSE / HTTP stream downstream throughput\n")
                         + f"TODO: {http.get('reason')}\n")
    if results.get("storm"):
        parts.append(storm_rows.storm_table(results, markdown))
    if results.get("targets"):
        rows = [[t["target"], t["value"], t["goal"], t["verdict"]] for t in results["targets"]]
        parts.append(table("Targets of issues 5, 16 and 29 (ratios within this run)",
                           ["target", "measured", "goal", "verdict"], rows, markdown))
    if results.get("profile"):
        prof = results["profile"]
        lines = [(f"py-spy profile of the protoflask worker under PING load "
                  f"({prof['connections']} conns, {prof['samples']} samples, {prof['file']})")]
        lines.append("  self time:")
        lines += [f"    {pct:5.1f}%  {f}" for f, pct in prof["self"][:12]]
        lines.append("  inclusive:")
        lines += [f"    {pct:5.1f}%  {f}" for f, pct in prof["inclusive"][:20]]
        lines.append("  self time by file:")
        lines += [f"    {pct:5.1f}%  {f}" for f, pct in prof.get("self_by_file", [])[:12]]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def compute_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    ping = results.get("ping", {})
    pf, fs = ping.get("protoflask", {}), ping.get("flask-sock", {})
    common = sorted({int(k) for k in pf} & {int(k) for k in fs})
    if common:
        n = max(common)
        a, b = pf[str(n)], fs[str(n)]
        if a.get("rt_per_s") and b.get("rt_per_s"):
            ratio = 100 * a["rt_per_s"] / b["rt_per_s"]
            targets.append({"target": f"PING->PONG rt/s @{n}, % of flask-sock echo",
                            "value": f"{ratio:.0f}% ({a['rt_per_s']:,.0f} / {b['rt_per_s']:,.0f})",
                            "goal": ">= 70%", "verdict": "PASS" if ratio >= 70 else "FAIL",
                            "ratio": round(ratio, 1), "connections": n})
            if a.get("server_us_per_op") and b.get("server_us_per_op"):
                cpu_ratio = 100 * b["server_us_per_op"] / a["server_us_per_op"]
                targets.append({"target": f"  same, from server CPU µs/reply @{n}",
                                "value": f"{cpu_ratio:.0f}% ({b['server_us_per_op']:.0f} / "
                                         f"{a['server_us_per_op']:.0f} µs)",
                                "goal": ">= 70%", "verdict": "PASS" if cpu_ratio >= 70 else "FAIL",
                                "ratio": round(cpu_ratio, 1), "connections": n})
        if a.get("p99_ms") and b.get("p99_ms"):
            r = a["p99_ms"] / b["p99_ms"]
            targets.append({"target": f"PING->PONG p99 @{n}, x flask-sock echo",
                            "value": f"{r:.2f}x ({a['p99_ms']:.2f} / {b['p99_ms']:.2f} ms)",
                            "goal": "<= 2x", "verdict": "PASS" if r <= 2 else "FAIL",
                            "ratio": round(r, 2), "connections": n})
    targets += issue16_targets(results)
    targets += mcp_targets(results)
    targets += storm_rows.storm_targets(results)
    tool = results.get("tool", {}).get("protoflask")
    if tool and tool.get("p50_ms") is not None:
        targets.append({"target": f"tool call p50 @{tool['connections']}",
                        "value": f"{tool['p50_ms']:.2f} ms", "goal": "< 2 ms",
                        "verdict": "PASS" if tool["p50_ms"] < 2 else "FAIL"})
    targets += before_targets(results)
    idle = results.get("idle", {}).get("protoflask", {})
    for n, r in sorted(idle.items(), key=lambda kv: int(kv[0])):
        if r.get("kb_per_session") is not None:
            targets.append({"target": f"KB per idle session @{n}",
                            "value": f"{r['kb_per_session']:.1f} KB", "goal": "<= 40 KB",
                            "verdict": "PASS" if r["kb_per_session"] <= 40 else "FAIL"})
        targets.append({"target": f"idle sessions held @{n}", "value": f"{r.get('held')}",
                        "goal": f"{n}", "verdict": "PASS" if r.get("held") == int(n) else "FAIL"})
    return targets


def before_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 28: PING's and the tool call's server CPU within 5% of the checkout before
    (--before). Each round measured both, one after the other (the order turned round
    every other round); the ratio of each round's pair, and their median, moves far less
    than either server's own figure when the machine's speed drifts from round to round
    (a shared VM's neighbours)."""
    ping = results.get("ping_rounds", {})
    after, before = ping.get("protoflask", {}), ping.get("protoflask-before", {})
    rows = [_pair_row(f"PING->PONG server µs/reply @{n}, x before (median of the rounds' pairs)",
                      after[n], before[n])
            for n in sorted(set(after) & set(before), key=int)]
    tool = results.get("tool_rounds", {})
    rows.append(_pair_row("tool call server µs/call, x before (median of the rounds' pairs)",
                          tool.get("protoflask", []), tool.get("protoflask-before", [])))
    return [row for row in rows if row]


def _pair_row(target: str, after: list[dict[str, Any]],
              before: list[dict[str, Any]]) -> dict[str, Any]:
    """One after/before row: the median of the rounds' ratios ({} when no round has both)."""
    pairs = [a["server_us_per_op"] / b["server_us_per_op"]
             for a, b in zip(after, before, strict=False)  # a stopped run: one a round short
             if a.get("server_us_per_op") and b.get("server_us_per_op")]
    if not pairs:
        return {}
    ratio = statistics.median(pairs)
    spread = f"{min(pairs):.2f}-{max(pairs):.2f}" if len(pairs) > 1 else "one round"
    return {"target": target, "value": f"{ratio:.3f}x ({len(pairs)} rounds: {spread})",
            "goal": "<= 1.05x", "verdict": _verdict(ratio <= 1.05), "ratio": round(ratio, 3),
            "rounds": [round(r, 3) for r in pairs]}


def measure_mcp(args: argparse.Namespace) -> dict[str, Any]:
    """bench/micro_mcp.py's CPU per call: MCP tools/call echo, and a native TOOL_CALL of
    echo over HTTP and over WebSocket, in one process, one run."""
    n = "1000" if args.quick else "5000"
    proc = subprocess.run([sys.executable, str(BENCH / "micro_mcp.py"),
                           "--n", n, "--repeat", "3", "--json"],
                          capture_output=True, text=True, timeout=600, check=True)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def mcp_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 27: an MCP tools/call of echo at most 2x a native TOOL_CALL's server CPU."""
    us = (results.get("mcp") or {}).get("us_per_call")
    if not us:
        return []
    http, ws = us["mcp"] / us["native-http"], us["mcp"] / us["native-ws"]
    return [{"target": "MCP tools/call echo CPU/call, x native TOOL_CALL over HTTP",
             "value": f"{http:.2f}x ({us['mcp']:.0f} / {us['native-http']:.0f} µs)",
             "goal": "<= 2x", "verdict": _verdict(http <= 2), "ratio": round(http, 2)},
            {"target": "  same, x native TOOL_CALL over WebSocket (info)",
             "value": f"{ws:.2f}x ({us['mcp']:.0f} / {us['native-ws']:.0f} µs)",
             "goal": "-", "verdict": "info", "ratio": round(ws, 2)}]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def issue16_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 16 ("faster per core"): each a ratio inside this run."""
    out: list[dict[str, Any]] = []
    ping = results.get("ping", {})

    def cell(name: str) -> tuple[int, dict[str, Any]] | None:
        levels = ping.get(name, {})
        if not levels:
            return None
        n = max(int(k) for k in levels)
        return n, levels[str(n)]

    def cpu_ratio(top: tuple[int, dict] | None, bottom: tuple[int, dict] | None,
                  label: str, goal: float) -> None:
        """A target row: the CPU per reply of ``top`` over ``bottom``, at the same level."""
        if top and bottom and top[0] == bottom[0] and top[1].get("server_us_per_op") \
                and bottom[1].get("server_us_per_op"):
            a, b = top[1]["server_us_per_op"], bottom[1]["server_us_per_op"]
            out.append({"target": f"[16] {label}", "value": f"{a / b:.2f}x ({a:.1f} / {b:.1f} µs)",
                        "goal": f"<= {goal}x", "verdict": _verdict(a / b <= goal),
                        "ratio": round(a / b, 3)})

    pf, echo = cell("protoflask"), cell("gevent-sansio")
    redis, fs = cell("protoflask-redis"), cell("flask-sock")
    if pf:
        cpu_ratio(pf, echo, f"PING->PONG CPU/reply @{pf[0]}, x sans-I/O echo", 1.5)
        cpu_ratio(redis, pf, f"on Redis (1 worker) CPU/reply @{pf[0]}, x in memory", 1.3)
    if pf and fs and pf[0] == fs[0] and pf[1].get("p99_ms") and fs[1].get("p99_ms"):
        a, b = pf[1]["p99_ms"], fs[1]["p99_ms"]
        out.append({"target": f"[16] PING->PONG p99 @{pf[0]}, x flask-sock echo",
                    "value": f"{a / b:.2f}x ({a:.2f} / {b:.2f} ms)", "goal": "<= 1x",
                    "verdict": _verdict(a <= b), "ratio": round(a / b, 3)})
    idle = results.get("idle", {}).get("protoflask", {})
    for n, r in sorted(idle.items(), key=lambda kv: int(kv[0])):
        if r.get("kb_per_session") is not None:
            out.append({"target": f"[16] KB per idle session @{n}",
                        "value": f"{r['kb_per_session']:.1f} KB (held {r.get('held')})",
                        "goal": "<= 20 KB",
                        "verdict": _verdict(r["kb_per_session"] <= 20
                                            and r.get("held") == int(n))})
    tool = results.get("tool", {}).get("protoflask")
    if tool and tool.get("p50_ms") is not None:
        out.append({"target": f"[16] tool call p50 @{tool['connections']}",
                    "value": f"{tool['p50_ms']:.2f} ms", "goal": "< 0.5 ms",
                    "verdict": _verdict(tool["p50_ms"] < 0.5)})
    http = results.get("http_transports") or {}
    rows = {r["transport"]: r for r in http.get("results", [])}
    ws = rows.get("websocket", {}).get("messages_per_s")
    for transport in ("sse", "stream", "duplex"):
        rate = rows.get(transport, {}).get("messages_per_s")
        if ws and rate:
            name = HTTP_ROW_LABELS.get(transport, transport)
            out.append({"target": f"[16] {name} PONGs/s, % of WebSocket's",
                        "value": f"{100 * rate / ws:.0f}% ({rate:,.0f} / {ws:,.0f})",
                        "goal": ">= 80%", "verdict": _verdict(rate >= 0.8 * ws),
                        "ratio": round(rate / ws, 3)})
    out += without_gunicorn_floor(rows)
    return out


def without_gunicorn_floor(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Where SSE and the stream would stand if gunicorn's request handling cost nothing.

    The floor row answers the same POSTs with a bare WSGI app under gunicorn: its server
    µs per message is gunicorn's own cost of one POST, spread over the batch. Each HTTP
    transport's server µs per message less that, against the WebSocket's (all three
    saturate the server's core, so rates go as the inverse of CPU per message)."""
    floor = rows.get("floor", {}).get("server_us_per_op")
    ws = rows.get("websocket", {}).get("server_us_per_op")
    if not floor or not ws:
        return []
    out = []
    for transport in ("sse", "stream"):
        us = rows.get(transport, {}).get("server_us_per_op")
        if us and us > floor:
            own = us - floor
            out.append({"target": f"[16] {transport} less gunicorn's POST floor (info)",
                        "value": f"{100 * ws / own:.0f}% ({ws:.2f} / ({us:.2f} - {floor:.2f}) "
                                 "µs/msg)",
                        "goal": "-", "verdict": "info", "ratio": round(ws / own, 3)})
    return out


# -- HTTP transports (SSE, HTTP stream) -------------------------------------------------------


HTTP_ROW_LABELS = {"duplex": "stream, full duplex", "floor": "floor: bare gunicorn POST"}


def measure_http(bench: Bench, srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    """SSE / HTTP-stream downstream throughput, next to the WebSocket in the same shape.

    Each session POSTs ``batch`` PINGs at once and waits for all their PONGs to come down
    (bench/http_downstream.py); the WebSocket row does the same over one socket
    (loadgen ``--mode batch``). The duplex row sends each batch as a chunk of the
    opening stream POST's own body instead (no request per batch). A last row sends the
    same POSTs to a bare WSGI app under gunicorn (bench/servers/gunicorn_post_floor.py):
    what gunicorn alone costs per POST.
    Marked TODO when the transports do not answer."""
    rows: list[dict[str, Any]] = []
    failures = []
    n, batch = args.http_connections, args.batch
    if bench.generator.supports("batch"):
        r = bench.measure(srv, "batch", n, batch=batch)
        r["transport"] = "websocket"
        rows.append(r)
    for transport in ("sse", "stream", "duplex"):
        r, failure = run_http_client(bench, srv, transport, args)
        if failure:
            failures.append(failure)
        else:
            rows.append(r)
    if not any(r["transport"] != "websocket" for r in rows):
        return {"status": "todo", "results": rows,
                "reason": "the SSE and HTTP stream transports did not work in this run ("
                          + "; ".join(failures) + "); measure them once they do"}
    floor = Server(FLOOR_SPEC, bench.server_cpu, bench.logdir, bench.token)
    bench.servers[f"{FLOOR_SPEC.name}@floor"] = floor
    try:
        floor.start()
        floor.wait_ready()
        r, failure = run_http_client(bench, floor, "floor", args)
    finally:
        floor.stop()
    if failure:
        failures.append(failure)
    else:
        rows.append(r)
    return {"status": "measured", "results": rows, "failures": failures}


def run_http_client(bench: Bench, srv: Server, transport: str,
                    args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """One bench/http_downstream.py run: its result, or a failure line."""
    cfg = {"baseUrl": f"http://127.0.0.1:{srv.port}", "token": bench.token,
           "transport": transport, "connections": args.http_connections, "batch": args.batch,
           "warmup": args.warmup, "seconds": args.seconds, "serverPid": srv.pid,
           "clkTck": os.sysconf("SC_CLK_TCK")}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "http_downstream.py"), json.dumps(cfg)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        cwd=str(BENCH))
    reader = LineReader(proc)
    try:
        r = reader.next_json(bench.progress, time.monotonic() + args.warmup + args.seconds + 60)
    finally:
        reap(proc)
    if r is None or r.get("error"):
        return {}, f"{transport}: " + (r or {}).get(
            "error", "".join(reader.stderr)[-500:] or "no result")
    return r, None


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a few-second smoke: short windows, small idle levels")
    p.add_argument("--only", default="",
                   help="comma list of sections: gencheck,ping,tool,stream,idle,http,mcp,"
                        "storm (default: all)")
    p.add_argument("--servers", default="",
                   help="comma list (default: protoflask,flask-sock,gevent-simple-ws,"
                        "websockets-asyncio,gevent-sansio; on Redis: protoflask-redis, "
                        "protoflask-redis-2w)")
    p.add_argument("--levels", default="", help="PING connection counts (default 1,10,100)")
    p.add_argument("--idle-levels", default="", help="idle session counts (default 1000,10000)")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per cell")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the PING sweep and the tool cells; each cell reports its "
                        "median round")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds per cell")
    p.add_argument("--tool-connections", type=int, default=10)
    p.add_argument("--stream-connections", type=int, default=10)
    p.add_argument("--parts", type=int, default=20, help="MESSAGE_PARTs per streamed message")
    p.add_argument("--http-connections", type=int, default=10,
                   help="sessions for the downstream (websocket / SSE / HTTP stream) section")
    p.add_argument("--batch", type=int, default=50,
                   help="PINGs per upstream write/POST in the downstream section")
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--settle", type=float, default=None,
                   help="seconds idle sessions are held before RSS is read")
    p.add_argument("--generator", choices=["auto", "c", "node", "python"], default="auto")
    p.add_argument("--storm", type=int, default=None,
                   help="connections per reconnect storm row (default 10000; --quick 100)")
    p.add_argument("--storm-rows", default=",".join(storm_rows.ROWS),
                   help="comma list of storm rows (the echo baseline always runs): "
                        + ",".join(storm_rows.ROWS))
    p.add_argument("--storm-server", default="protoflask",
                   help="the protoflask of the storm rows: protoflask-before (with --before "
                        "DIR) runs them on another checkout")
    p.add_argument("--storm-inflight", type=int, default=100,
                   help="handshakes in flight in a storm")
    p.add_argument("--storm-heartbeat-ms", type=int, default=2000,
                   help="HEARTBEAT_INTERVAL of the storm's WebSocket row (held through rounds)")
    p.add_argument("--storm-heartbeat-rounds", type=int, default=2)
    p.add_argument("--no-pin", action="store_true", help="do not pin to CPUs")
    p.add_argument("--profile", action="store_true",
                   help="py-spy record the protoflask worker under PING load")
    p.add_argument("--profile-seconds", type=float, default=10)
    p.add_argument("--out", default=str(BENCH / "results"), help="directory for the JSON")
    p.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    p.add_argument("--render", metavar="JSON",
                   help="print the tables of an earlier run's JSON file and exit")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--before", metavar="DIR",
                   help="also run protoflask from another checkout (e.g. a git worktree of "
                        "the commit before a change) as protoflask-before, side by side")
    p.add_argument("--no-gate", action="store_true",
                   help="exit 0 even when a target row FAILs (smoke runs, whose windows are "
                        "too short for the targets to mean anything)")
    args = p.parse_args(argv)
    q = args.quick
    args.seconds = args.seconds if args.seconds is not None else (1.5 if q else 8.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if q else 2.0)
    args.settle = args.settle if args.settle is not None else (0.5 if q else 2.0)
    args.levels = [int(x) for x in (args.levels or "1,10,100").split(",") if x]
    args.idle_levels = [int(x) for x in (args.idle_levels or ("200" if q else "1000,10000"))
                        .split(",") if x]
    all_sections = ["gencheck", "ping", "tool", "stream", "idle", "http", "mcp", "storm"]
    args.sections = [s for s in (args.only.split(",") if args.only else all_sections) if s]
    if q and not args.only:
        args.sections.remove("gencheck")
    unknown = set(args.sections) - set(all_sections)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.before:
        os.environ["BENCH_BEFORE"] = args.before
    specs = server_specs(1)
    args.server_names = [s for s in (args.servers.split(",") if args.servers
                                     else DEFAULT_SERVERS) if s]
    if args.before and "protoflask-before" not in args.server_names:
        at = args.server_names.index("protoflask") + 1 if "protoflask" in args.server_names \
            else 0
        args.server_names.insert(at, "protoflask-before")
    unknown = set(args.server_names) - set(specs)
    if unknown:
        p.error(f"unknown servers: {', '.join(sorted(unknown))}")
    args.storm = args.storm if args.storm is not None else (100 if q else 10000)
    args.storm_rows = [r for r in args.storm_rows.split(",") if r]
    unknown = set(args.storm_rows) - set(storm_rows.ROWS)
    if unknown:
        p.error(f"unknown storm rows: {', '.join(sorted(unknown))}")
    if q:
        args.storm_heartbeat_rounds = min(args.storm_heartbeat_rounds, 1)
    args.max_connections = max([*args.idle_levels, *args.levels, 1000]) + 1000
    return args


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the servers are stopped and partial results written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        saved["targets"] = compute_targets(saved)  # today's targets on the saved figures
        print(render(saved, server_specs(1), args.markdown))
        return gate(saved["targets"], args.no_gate)
    signal.signal(signal.SIGTERM, _terminated)
    fd_limit = raise_fd_limit(2 * max(args.max_connections, args.storm) + 1000)
    if fd_limit < max(args.idle_levels, default=0) + 500:
        print(f"bench: RLIMIT_NOFILE is {fd_limit}; idle levels above that will fail",
              file=sys.stderr)
    bench = Bench(args)
    if bench.gen_cpu is not None:
        os.sched_setaffinity(0, {bench.gen_cpu})  # this process stays off the server's core
    started = dt.datetime.now().astimezone()
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": machine_info(),
        "pinning": {"server_cpu": bench.server_cpu, "generator_cpu": bench.gen_cpu},
        "generator": bench.generator.kind,
        "frame_bytes": ping_frame_bytes(),
        "settings": {"warmup": args.warmup, "seconds": args.seconds, "levels": args.levels,
                     "idle_levels": args.idle_levels, "parts": args.parts,
                     "connect_concurrency": args.connect_concurrency, "rounds": args.rounds,
                     "servers": args.server_names, "sections": args.sections,
                     "fd_limit": fd_limit},
    }
    bench.results = results
    names = args.server_names
    cell = args.warmup + args.seconds + 0.7
    steps: list[tuple[str, float, Callable[[], None]]] = []
    live: dict[str, Server] = {}

    def start_live() -> None:
        live.update(bench.start_servers(names))

    if set(args.sections) - {"idle", "storm", "mcp"}:  # the others start their own
        steps.append(("starting servers", 3.0, start_live))
    # The generator check drives the fastest bare echo (websockets asyncio on this machine)
    # with each generator: the generator that is not the bottleneck keeps its CPU below
    # 100% while the server's core saturates.
    check_target = next((s for s in ("websockets-asyncio", "gevent-sansio") if s in names), None)
    gen_check = "gencheck" in args.sections and check_target is not None

    if gen_check:
        kinds = ["c", "node", "python"]

        def make_check(kind: str) -> Callable[[], None]:
            def run() -> None:
                try:
                    gen = bench.generator if kind == bench.generator.kind else Generator(
                        kind, bench.gen_cpu)
                except RuntimeError as exc:
                    results.setdefault("generator_check_skipped", {})[kind] = str(exc)
                    return
                saved, bench.generator = bench.generator, gen
                try:
                    r = bench.measure(live[check_target], "ping", max(args.levels))
                finally:
                    bench.generator = saved
                results.setdefault("generator_check", []).append(r)
            return run

        for kind in kinds:
            steps.append((f"generator check: {kind}", cell, make_check(kind)))

    if "ping" in args.sections:
        # Interleaved (every server at one level, then the next level), so that a burst of
        # outside load hits all servers alike; with --rounds the whole sweep repeats, the
        # servers' order turned round every other round (as the tool cells below: no
        # server always follows the same one), and each cell reports the round with the
        # median rt/s.
        for rnd in range(args.rounds):
            for n in args.levels:
                for name in names if rnd % 2 == 0 else names[::-1]:
                    def run(name: str = name, n: int = n) -> None:
                        if not bench.generator.supports("ping"):
                            return
                        r = bench.measure(live[name], "ping", n)
                        runs = results.setdefault("ping_rounds", {}).setdefault(
                            name, {}).setdefault(str(n), [])
                        runs.append(r)
                        ordered = sorted(runs, key=lambda x: x.get("rt_per_s") or 0)
                        median = dict(ordered[(len(ordered) - 1) // 2])
                        median["rounds_rt_per_s"] = [x.get("rt_per_s") for x in runs]
                        median["rounds_server_us_per_op"] = [x.get("server_us_per_op")
                                                             for x in runs]
                        results.setdefault("ping", {}).setdefault(name, {})[str(n)] = median
                    label = f"ping {name} x{n}" + (f" (round {rnd + 1})" if args.rounds > 1
                                                   else "")
                    steps.append((label, cell, run))

    tooled_servers = [n for n in ("protoflask", "protoflask-before")  # --before: both
                      if n in names and "tool" in args.sections]
    for rnd in range(args.rounds):
        # Like the PING sweep: each round has every server, the order turned round every
        # other round (before, after; after, before), so that a burst of outside load or a
        # drift of the machine falls on both alike; each cell reports its median round.
        for tooled in tooled_servers if rnd % 2 == 0 else tooled_servers[::-1]:
            def run_tool(tooled: str = tooled) -> None:
                if not bench.generator.supports("tool"):
                    return
                r = bench.measure(live[tooled], "tool", args.tool_connections)
                runs = results.setdefault("tool_rounds", {}).setdefault(tooled, [])
                runs.append(r)
                ordered = sorted(runs, key=lambda x: x.get("server_us_per_op") or 0)
                median = dict(ordered[(len(ordered) - 1) // 2])
                median["rounds_server_us_per_op"] = [x.get("server_us_per_op") for x in runs]
                results.setdefault("tool", {})[tooled] = median
            label = f"tool calls {tooled} x{args.tool_connections}" + (
                f" (round {rnd + 1})" if args.rounds > 1 else "")
            steps.append((label, cell, run_tool))

    if "protoflask" in names and "stream" in args.sections:
        def run_stream() -> None:
            if bench.generator.supports("stream"):
                results.setdefault("stream", {})["protoflask"] = bench.measure(
                    live["protoflask"], "stream", args.stream_connections, parts=args.parts)
        steps.append((f"streaming protoflask x{args.stream_connections}", cell, run_stream))

    if args.profile and "protoflask" in names:
        def run_profile() -> None:
            results["profile"] = profile_protoflask(bench, live["protoflask"], args)
        steps.append(("py-spy profile of protoflask", args.profile_seconds + 4, run_profile))

    if "http" in args.sections and "protoflask" in names:
        def run_http() -> None:
            results["http_transports"] = measure_http(bench, live["protoflask"], args)
        steps.append(("downstream: websocket, SSE, HTTP stream", 3 * cell + 1, run_http))

    if "mcp" in args.sections:
        def run_mcp() -> None:
            results["mcp"] = measure_mcp(args)
        steps.append(("MCP tools/call vs native TOOL_CALL (in process)", 15.0, run_mcp))

    def stop_live() -> None:
        for srv in live.values():
            srv.stop()
        live.clear()

    steps.append(("stopping servers", 1.0, stop_live))

    if "idle" in args.sections:
        for name in names:
            for n in args.idle_levels:
                def run_idle(name: str = name, n: int = n) -> None:
                    results.setdefault("idle", {}).setdefault(name, {})[str(n)] = \
                        idle_level(bench, name, n)
                est = 4 + args.settle + n / (300 if name == "protoflask" else 900)
                steps.append((f"idle {name} x{n}", est, run_idle))

    if "storm" in args.sections:
        def run_storms() -> None:
            results["storm"] = storm_rows.measure_storms(bench, args)
        per_row = 6 + args.storm / 400
        est = args.rounds * (len(args.storm_rows) + 1) * per_row + args.rounds * (
            args.storm_heartbeat_rounds * args.storm_heartbeat_ms / 1000)
        steps.append((f"reconnect storms x{args.storm}", est, run_storms))

    progress = Progress(sum(s[1] for s in steps), enabled=not args.no_progress)
    bench.progress = progress
    cpu_before = cpu_times()
    t0 = time.monotonic()
    interrupted = None
    try:
        for name, est, fn in steps:
            progress.step(name, est)
            fn()
    except KeyboardInterrupt:
        interrupted = "interrupted"
    except Exception as exc:  # noqa: BLE001 - report what we have, then fail
        interrupted = f"{type(exc).__name__}: {exc}"
    finally:
        bench.stop_all()
        progress.close()
    results["duration_s"] = round(time.monotonic() - t0, 1)
    results["machine"]["busy_pct_during_run"] = busy_pct(cpu_before, cpu_times())
    results["machine"]["loadavg_after"] = os.getloadavg()
    results["targets"] = compute_targets(results)
    if interrupted:
        results["error"] = interrupted
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{started.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    print(render(results, bench.specs, args.markdown))
    busy = results["machine"]["busy_pct_during_run"]
    print("machine busy during the run: " + ", ".join(
        f"{k} {v}%" for k, v in busy.items()) + f"; loadavg before "
        f"{results['machine']['loadavg_before'][0]:.2f}, after "
        f"{results['machine']['loadavg_after'][0]:.2f}; took {results['duration_s']}s")
    print(f"JSON: {out}")
    shutil.rmtree(bench.logdir, ignore_errors=True) if not interrupted else print(
        f"server logs: {bench.logdir}", file=sys.stderr)
    if interrupted:
        print(f"bench: stopped early: {interrupted}", file=sys.stderr)
        return 1
    return gate(results["targets"], args.no_gate)


#: The exit code of a run in which a target row FAILs.
EXIT_TARGET_FAILED = 3


def gate(targets: list[dict[str, Any]], no_gate: bool) -> int:
    """0, or EXIT_TARGET_FAILED (the failing rows named on stderr) unless --no-gate."""
    failed = [t["target"].strip() for t in targets if t.get("verdict") == "FAIL"]
    if not failed:
        return 0
    print(f"bench: {len(failed)} target(s) FAIL: " + "; ".join(failed), file=sys.stderr)
    return 0 if no_gate else EXIT_TARGET_FAILED


def idle_level(bench: Bench, name: str, n: int) -> dict[str, Any]:
    """A fresh server; warm it up; read RSS; hold n idle sessions; read RSS again."""
    srv = bench.start_servers([name])[name]
    try:
        bench.measure(srv, "ping", 10, warmup=0.2, seconds=0.5)  # first-use imports, caches
        time.sleep(0.3)
        base = rss_kb(srv.pid)
        r = bench.hold_idle(srv, n)
        r["rss_base_kb"] = base
        held = r.get("held") or 0
        r["kb_per_session"] = round((r["rss_after_kb"] - base) / held, 2) if held else None
        return r
    finally:
        srv.stop()


def profile_protoflask(bench: Bench, srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    pyspy = shutil.which("py-spy")
    if not pyspy:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    n = max(args.levels)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    raw = out_dir / f"{stamp}-protoflask-pyspy.txt"
    spy = subprocess.Popen(
        [pyspy, "record", "--pid", str(srv.pid), "--duration", str(int(args.profile_seconds)),
         "--rate", "250", "--format", "raw", "--nolineno", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        bench.measure(srv, "ping", n, warmup=0.5, seconds=args.profile_seconds + 1)
        _, err = spy.communicate(timeout=30)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait()
    if not raw.exists():
        return {"error": f"py-spy produced nothing: {err[-1000:]}"}
    return {"connections": n, "file": str(raw), **summarize_collapsed(raw)}


storm_rows.RUN = sys.modules[__name__]

if __name__ == "__main__":
    sys.exit(main())
