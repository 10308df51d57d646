"""A chaos soak of a cluster: faults on a schedule, a checker comparing content per seq.

    python bench/cluster_chaos.py --sentinel --per-transport 20 --ts 4   # the long run
    python bench/cluster_chaos.py --short              # the CI version (about 50 s)
    python bench/cluster_chaos.py --per-transport 20 --faults kill9,flushall,outage10

Starts a private redis-server on a port of its own (never the shared one: these faults
flush, stop and restart it), or with ``--sentinel`` a master, its replica and a real
``redis-server --sentinel`` (the nodes given REDIS_SENTINELS and the master's name);
``--nodes`` gunicorn masters (``-k gevent``, ``--workers`` workers each, serving
bench/chaos_app.py: protoflask plus the application tool ``work``) and nginx with
deploy/nginx/protoflask.conf round robin over them, no stickiness (without nginx: a
message saying so, no run). ``--per-transport`` sessions on each of ws, sse and stream,
each a protoflask.client with reconnect on, in a loop: a 3-part text (its echo
compared), ``add``, ``echo``, a PING; beside that, one ``work`` call at a time that
runs 2-10 s with a TOOL_UPDATE every 0.5 s. ``--ts N``: N sessions per transport of the
TypeScript client too (bench/chaos_ts.mjs). Then the faults, one at a time, ``--gap``
seconds apart:

    kill9      SIGKILL a node (master and workers); started again on its port
    sigterm    SIGTERM a node (drain); started again on its port
    sigstop    SIGSTOP one worker of a node for 20 s, then SIGCONT
    resets     nginx killed and started again: every client connection reset at once
    flushall   FLUSHALL (every holder alive)
    restart    redis-server (the master) killed and started again, empty
    outage10   the master stopped (SIGSTOP) 10 s: unreachable, back with its data
    outage60   the same, 60 s
    failover   (--sentinel) the master killed, the sentinel promotes the replica; the
               old master comes back as a replica of the new one

The checker keeps, per session, every frame the client read (before its own dedup by
seq) and compares content per seq:

    lost        a seq the application never got, without a REPLAY_UNAVAILABLE saying
                so; and texts whose echo never came or came different
    reused      a seq that arrived again with different content
    duplicates  a seq handed to the application twice
    declared    ERROR REPLAY_UNAVAILABLE received (loss declared, not silent)
    stranded    calls that got no TOOL_DONE within 150 s (longer than any outage)
    done twice  calls that got more than one TOOL_DONE
    dead        sessions whose client gave up (ConnectionLost / a final refusal)
    serving     seconds from the end of the fault until every live session completed a
                call (add, echo, text or PING) started after it

Prints a table (markdown) and, with --json, the numbers. Exit status 1 when an
invariant broke (lost, reused, duplicates, stranded, done twice or dead above 0).
``--logs DIR`` keeps each node's log (warnings and up) there; with ``--debug`` also
every move of a session (taken, let go, copied over, kept, fenced), and for a silent loss
the client's side of it (its seqs' arrival and its reconnects) on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from protoflask.auth import TokenAuthority  # noqa: E402
from protoflask.client import Client  # noqa: E402
from protoflask.client.errors import ProtoClientError, ToolError  # noqa: E402
from tests.nginx import Nginx  # noqa: E402  (deploy/nginx/protoflask.conf, as tested)
from cluster_faults import free_port, wait  # noqa: E402  (bench/, beside this script)
from chaos_redis import PlainRedis, SentinelRedis  # noqa: E402

SECRET = "chaos-secret-that-is-long-enough-for-hs256!"
FAULTS = ("kill9", "sigterm", "sigstop", "resets", "flushall", "restart", "outage10",
          "outage60", "failover")
SIGSTOP_S = 20
CALL_TIMEOUT = 150.0  # longer than the longest outage: a call is stranded, not slow


class Node:
    """A gunicorn master with its workers, in a process group of its own."""

    def __init__(self, redis_env: dict[str, str], workers: int, port: int | None = None,
                 log: Path | None = None) -> None:
        self.redis_env, self.workers, self.log = redis_env, workers, log
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "JWT_SECRET": SECRET, **self.redis_env,
               "ENABLE_LOGGING": "false", "ALLOWED_ORIGINS": "*",
               "HOST": "127.0.0.1", "PORT": str(self.port),
               "WEB_CONCURRENCY": str(self.workers), "LOG_LEVEL": "warning"}
        for name in ("REDIS_URL", "REDIS_SENTINELS"):
            if name not in self.redis_env:
                env.pop(name, None)
        err = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "--pythonpath", str(ROOT / "bench"), "chaos_app:app"], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        if self.log is not None:
            err.close()  # type: ignore[union-attr]
        wait(self.answers, 30, "gunicorn")

    def answers(self) -> bool:
        try:
            return requests.get(self.base + "/health", timeout=1).status_code in (200, 503)
        except requests.RequestException:
            return False

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def kill9(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill9()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # any worker left behind
        except ProcessLookupError:
            pass


def token(user: str) -> str:
    return TokenAuthority(SECRET, ("HS256",), "2h").issue(user)


class Recording(Client):
    """protoflask.client, keeping every frame it reads (before its dedup by seq)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames: dict[int, bytes] = {}
        self.reused = 0
        self.delivered: set[int] = set()
        self.duplicates = 0
        self.declared = 0
        #: seqs a REPLAY_UNAVAILABLE said are gone: (after, before), both excluded
        self.declared_gaps: list[tuple[int, int]] = []
        self.dones: dict[str, int] = {}
        self.on_message = self._seen
        #: (--debug) when each seq first arrived, and the connection's opens and closes
        self.arrived: dict[int, float] = {}
        self.events: list[tuple[float, str]] = []

    def _open(self, resume: bool) -> None:
        last = self.last_seq
        try:
            super()._open(resume)
        except Exception as exc:
            self.events.append((time.time(), f"open failed (resume from {last}): {exc}"))
            raise
        how = f"resume from {last}" if resume else "new"
        self.events.append((time.time(), f"opened ({how})"))

    def _on_close(self, conn: Any, code: int | None, error: BaseException | None) -> None:
        if conn is self._conn:
            self.events.append((time.time(), f"closed {code} {error or ''} at {self.last_seq}"))
        super()._on_close(conn, code, error)

    def timeline(self, seqs: list[int]) -> list[str]:
        """What happened around the first of ``seqs``: the arrival of its neighbours and
        the connection's opens and closes, by wall clock (to read beside the nodes' logs)."""
        first = seqs[0]
        marks = [(t, f"seq {s} arrived") for s, t in self.arrived.items()
                 if first - 3 <= s <= seqs[-1] + 3]
        if not marks:
            return []
        lo, hi = min(t for t, _ in marks) - 10, max(t for t, _ in marks) + 10
        marks += [(t, e) for t, e in self.events if lo <= t <= hi]
        return [time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d} {e}"
                for t, e in sorted(marks)]

    def _on_frame(self, conn: Any, data: bytes) -> None:
        try:
            seq = int(orjson.loads(data)["seq"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            seq = None
        if seq is not None:
            self.arrived.setdefault(seq, time.time())
            before = self.frames.setdefault(seq, bytes(data))
            if before != bytes(data):
                self.reused += 1
        super()._on_frame(conn, data)

    def _seen(self, msg: dict[str, Any]) -> None:
        seq = int(msg["seq"])
        if seq in self.delivered:
            self.duplicates += 1
        self.delivered.add(seq)
        if msg["type"] == "ERROR" and msg["payload"].get("code") == "REPLAY_UNAVAILABLE":
            self.declared += 1
            first = msg["payload"].get("detail", {}).get("first_available")
            if first is not None:
                # what it declares gone: the seqs between the last one delivered below
                # first_available and it (not below the ERROR's own seq: the replay of
                # what is still there comes before the ERROR)
                below = [s for s in self.delivered if s < int(first)]
                self.declared_gaps.append((max(below, default=0), int(first)))
        elif msg["type"] == "TOOL_DONE":
            cid = msg["payload"]["call_id"]
            self.dones[cid] = self.dones.get(cid, 0) + 1


class Session(threading.Thread):
    """One client session: quick steps in a loop (a 3-part text and its echo, ``add``,
    ``echo``, a PING), and beside them one ``work`` call at a time (2-10 s, a TOOL_UPDATE
    every 0.5 s)."""

    def __init__(self, url: str, transport: str, n: int, soak: "Soak") -> None:
        super().__init__(daemon=True)
        self.transport, self.soak = transport, soak
        self.client = Recording(url, token(f"{transport}-{n}"), transport=transport,
                                timeout=10.0, reconnect_timeout=600.0)
        self.calls = self.stranded = self.failed_calls = self.texts_lost = 0
        self.work_calls = self.updates = 0
        self.dead: str | None = None
        self.errors: dict[str, int] = {}  # what failed calls raised, by kind
        self.last_ok = 0.0  # monotonic time a quick step started that then completed
        self.calling_since: float | None = None  # the step in flight started then
        self.work: tuple[Any, float] | None = None  # (the work call, when it started)
        self.works_started = 0
        self.step_kind = ""

    def step(self, n: int) -> None:
        c = self.client
        kind = n % 4
        self.step_kind = ("text", "add", "echo", "ping")[kind]
        if kind == 0:
            parts = [f"{self.name}-{n} ", "in three ", "parts"]
            c.send_text(parts)
            echo = c.next_text(timeout=CALL_TIMEOUT)
            if echo.text != "".join(parts):
                self.texts_lost += 1
        elif kind == 1:
            assert c.call_tool("add", {"a": n, "b": 1}, timeout=CALL_TIMEOUT) == \
                {"result": n + 1}
        elif kind == 2:
            c.call_tool("echo", {"message": f"{self.name}-{n}"}, timeout=CALL_TIMEOUT)
        else:
            c.ping(timeout=CALL_TIMEOUT)

    def tend_work(self) -> None:
        """Start the next ``work`` call once the last one ended; count how it ended."""
        if self.work is not None:
            call, since = self.work
            if not call.done:
                if time.monotonic() - since > CALL_TIMEOUT:
                    self.stranded += 1
                    print(f"stranded: {self.transport} session={self.client.session_id} "
                          f"work call {call.call_id}", file=sys.stderr, flush=True)
                    self.work = None
                return
            self.work = None
            self.work_calls += 1
            self.updates += len(call.updates)
            try:
                call.result(0)
            except ToolError:
                self.failed_calls += 1
            except ProtoClientError as exc:
                kind = f"{type(exc).__name__} {exc.code}"
                self.errors[kind] = self.errors.get(kind, 0) + 1
        self.works_started += 1
        seconds = 2 + (self.works_started * 3) % 9
        self.work = (self.client.call_tool_async("work", {"seconds": seconds}),
                     time.monotonic())

    def run(self) -> None:
        try:
            self.client.connect()
        except ProtoClientError as exc:
            self.dead = f"connect: {exc}"
            return
        n = 0
        while self.soak.running and self.dead is None:
            n += 1
            started = self.calling_since = time.monotonic()
            try:
                self.tend_work()
                self.step(n)
                self.last_ok = started
            except ToolError:
                self.failed_calls += 1  # one TOOL_DONE ERROR (say, its node was lost)
            except TimeoutError:
                self.stranded += 1
                print(f"stranded: {self.transport} session={self.client.session_id} "
                      f"step={self.step_kind}", file=sys.stderr, flush=True)
            except ProtoClientError as exc:
                kind = f"{type(exc).__name__} {exc.code}"
                self.errors[kind] = self.errors.get(kind, 0) + 1
                if self.client._fatal is not None:  # the session ended for good
                    self.dead = f"{type(exc).__name__}: {exc}"
                time.sleep(0.5)
            self.calls += 1
            self.calling_since = None
            time.sleep(self.soak.pause)

    def report(self, final: bool = False) -> dict[str, int]:
        """The session's counts; ``final``: a step or work call still waiting after 30 s
        counts as stranded too (the run ends before its 150 s would)."""
        c = self.client
        now = time.monotonic()
        since = self.calling_since
        waiting = int(final and since is not None and now - since > 30)
        if final and self.work is not None and not self.work[0].done \
                and now - self.work[1] > 30:
            waiting += 1
        seen = set(c.delivered)
        top = max(seen) if seen else 0
        gaps = list(c.declared_gaps)
        missing = [s for s in range(1, top + 1) if s not in seen]
        silent = [s for s in missing if not any(a < s < b for a, b in gaps)]
        return {"lost": len(silent) + self.texts_lost, "declared_lost": len(missing) - len(silent),
                "reused": c.reused, "duplicates": c.duplicates,
                "declared": c.declared, "stranded": self.stranded + waiting,
                "done_twice": sum(1 for v in c.dones.values() if v > 1),
                "dead": int(self.dead is not None), "calls": self.calls,
                "work_calls": self.work_calls, "updates": self.updates,
                "tool_errors": self.failed_calls}


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.running = True
        self.pause = args.pause
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise SystemExit("nginx is not installed (apt-get install nginx)")
        self.tmp = Path(tempfile.mkdtemp(prefix="chaos-nginx-"))
        self.redis: PlainRedis | SentinelRedis = \
            SentinelRedis(self.tmp) if args.sentinel else PlainRedis()
        logs = Path(args.logs) if args.logs else None
        if args.debug:
            os.environ["CHAOS_DEBUG"] = "1"  # (bench/chaos_app.py; the nodes inherit it)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        self.nodes = [Node(self.redis.env, args.workers,
                           log=logs / f"node{k}.log" if logs is not None else None)
                      for k in range(args.nodes)]
        self.nginx = Nginx(nginx, [n.port for n in self.nodes], self.tmp)
        self.sessions = [Session(self.nginx.base_url, t, i, self)
                         for t in ("ws", "sse", "stream") for i in range(args.per_transport)]
        self.ts: subprocess.Popen[str] | None = None
        if args.ts:
            node = shutil.which("node")
            if node is None or not (ROOT / "clients/js/dist/index.js").exists() \
                    or not (ROOT / "bench/node_modules/ws").is_dir():
                raise SystemExit("--ts needs node, clients/js built (npm run build) and "
                                 "bench's packages (npm ci in bench)")
            spec = {"url": self.nginx.base_url, "callTimeoutMs": int(CALL_TIMEOUT * 1000),
                    "sessions": [{"token": token(f"ts-{t}-{i}"), "transport": t}
                                 for t in ("websocket", "sse", "stream")
                                 for i in range(args.ts)]}
            self.ts = subprocess.Popen([node, str(ROOT / "bench/chaos_ts.mjs"),
                                        json.dumps(spec)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)

    def ts_report(self) -> dict[str, Any] | None:
        """The TypeScript client's sessions over the whole run (stdin closed: they stop)."""
        if self.ts is None:
            return None
        try:  # stdin closed: the sessions stop; one line once each ended its call in flight
            out, _ = self.ts.communicate(timeout=CALL_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            self.ts.kill()
            return {"fault": "TS client, whole run", "dead": "the TS sessions did not stop"}
        lines = out.strip().splitlines()
        if not lines:
            return {"fault": "TS client, whole run", "dead": "no report from the TS sessions"}
        sessions = json.loads(lines[-1])
        for s in sessions:  # a call done twice or stranded: which, its TOOL_DONEs (for the logs)
            if s.get("twice"):
                print(f"done twice: ts {s['transport']} {json.dumps(s['twice'])}",
                      file=sys.stderr, flush=True)
            if s.get("strandedCalls"):
                print(f"stranded: ts {s['transport']} {json.dumps(s['strandedCalls'])}",
                      file=sys.stderr, flush=True)
        total: dict[str, Any] = {"fault": "TS client, whole run"}
        for key, name in (("lost", "lost"), ("stranded", "stranded"),
                          ("doneTwice", "done_twice"), ("toolErrors", "tool_errors"),
                          ("calls", "calls"), ("workCalls", "work_calls")):
            total[name] = sum(s[key] for s in sessions)
        total["dead"] = sum(1 for s in sessions if s["dead"])
        return total

    def close(self) -> None:
        self.running = False
        if self.ts is not None and self.ts.poll() is None:
            self.ts.kill()
        for s in self.sessions:
            s.client.close(flush_timeout=1)
        self.nginx.stop()
        for node in self.nodes:
            node.kill9()
        self.redis.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


    # -- faults ------------------------------------------------------------------------

    def fault(self, name: str, k: int) -> None:
        node = self.nodes[k % len(self.nodes)]
        if name == "kill9":
            node.kill9()
            node.start()
        elif name == "sigterm":
            node.sigterm()
            node.start()
        elif name == "sigstop":
            pid = node.worker_pids()[0]
            os.kill(pid, signal.SIGSTOP)
            time.sleep(SIGSTOP_S)
            os.kill(pid, signal.SIGCONT)
        elif name == "resets":
            self.nginx.restart()
        elif name == "flushall":
            self.redis.rdb().flushall()
        elif name == "restart":
            self.redis.restart_empty()
        elif name.startswith("outage"):
            self.redis.stop_for(int(name[len("outage"):]))
        elif name == "failover":
            self.redis.failover()
        else:
            raise SystemExit(f"unknown fault {name!r}")

    def serving_again(self, since: float, within: float) -> float | None:
        """Seconds from ``since`` until every session still alive completed a call
        started after it; None if not within ``within`` (the ones that did not are
        listed on stderr)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            live = [s for s in self.sessions if s.dead is None]
            if all(s.last_ok >= since for s in live):
                return max((s.last_ok for s in live), default=since) - since
            time.sleep(0.1)
        now = time.monotonic()
        for s in self.sessions:
            if s.dead is None and s.last_ok < since:
                c = s.client
                print(f"not serving: {s.transport} session={c.session_id} "
                      f"step={s.step_kind} waiting={now - (s.calling_since or now):.0f}s "
                      f"connected={c.connected} last_seq={c.last_seq} "
                      f"reconnects={c.reconnects}",
                      file=sys.stderr, flush=True)
        return None

    def run(self) -> list[dict[str, Any]]:
        for s in self.sessions:
            s.start()
        wait(lambda: all(s.calls > 0 or s.dead for s in self.sessions), 60,
             "every session to complete a call")
        rows: list[dict[str, Any]] = []
        before = self.totals()
        for k, name in enumerate(self.args.faults):
            time.sleep(self.args.gap / 2)
            self.fault(name, k)
            ended = time.monotonic()
            serving = self.serving_again(ended, self.args.gap + 60)
            time.sleep(self.args.gap / 2)
            now = self.totals(final=k == len(self.args.faults) - 1)
            rows.append({"fault": name, **{key: now[key] - before[key] for key in now},
                         "serving_s": None if serving is None else round(serving, 1)})
            before = now
        return rows

    def totals(self, final: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sessions:
            for key, value in s.report(final).items():
                out[key] = out.get(key, 0) + value
        return out


BROKEN = ("lost", "reused", "duplicates", "stranded", "done_twice", "dead")


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["fault", *BROKEN, "declared", "declared_lost", "tool_errors", "calls",
            "work_calls", "updates", "serving_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "-")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true",
                        help="the CI version: 2 sessions per transport, 4 faults")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-transport", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.1, help="s between calls")
    parser.add_argument("--gap", type=float, default=16.0, help="s between faults")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--ts", type=int, default=0,
                        help="sessions per transport of the TypeScript client as well")
    parser.add_argument("--sentinel", action="store_true",
                        help="Redis as a master, a replica and a sentinel (REDIS_SENTINELS)")
    parser.add_argument("--logs", help="keep each node's log (warnings and up) here")
    parser.add_argument("--debug", action="store_true",
                        help="with --logs: the nodes log every move of a session too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.short:
        args.per_transport, args.workers, args.gap = 2, 1, 6.0
        args.faults = "kill9,flushall,outage10,restart"
    args.faults = [f for f in args.faults.split(",") if f]
    if "failover" in args.faults and not args.sentinel:
        args.faults.remove("failover")  # (it needs the sentinel's replica)
    # SIGTERM (a test's timeout): stop every process started here (their own sessions)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    soak = Soak(args)
    try:
        rows = soak.run()
        print(table(rows), flush=True)  # (before the TS report, which may take a while)
        ts = soak.ts_report()
        if ts is not None:
            rows.append(ts)
    finally:
        soak.close()
    for s in soak.sessions:  # where a silent loss was, for the logs
        seen = s.client.delivered
        gaps = s.client.declared_gaps
        silent = [q for q in range(1, max(seen, default=0) + 1) if q not in seen
                  and not any(a < q < b for a, b in gaps)]
        if silent:
            print(f"lost: {s.transport} session={s.client.session_id} seqs={silent[:20]}",
                  *s.client.timeline(silent), sep="\n  ", file=sys.stderr, flush=True)
    dead = [f"{s.transport}: {s.dead}" for s in soak.sessions if s.dead]
    errors: dict[str, int] = {}
    for s in soak.sessions:
        for kind, count in s.errors.items():
            errors[f"{s.transport} {kind}"] = errors.get(f"{s.transport} {kind}", 0) + count
    if errors:
        print("calls that raised:", json.dumps(errors))
    print(table(rows), flush=True)
    if dead:
        print("dead sessions:", *dead, sep="\n  ")
    if args.json:
        print(json.dumps(rows))
    broken = any(row.get(k) for row in rows for k in BROKEN) or \
        any(row.get("serving_s", 0) is None for row in rows)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
