"""The reconnect storm rows of bench/run.py (issue 29), beside a bare echo in one run.

Each row is a fresh server (pinned like every bench server) and one bench/storm.py run
(on the generator's CPU) doing N handshakes with ``inflight`` at a time, every
connection held until the row ends:

    echo          gevent StreamServer + websockets sans-I/O: the WebSocket upgrade alone
                  (the baseline every ratio is taken against, measured in the same round)
    ws            protoflask: upgrade + HELLO + its reply (default heartbeat)
    memory        the same storm on a server whose HEARTBEAT_INTERVAL is short, held
                  through ``heartbeat_rounds`` heartbeat rounds: the worker's RSS read
                  after the storm and after the rounds (a short heartbeat in the ws row
                  would add its PINGs to the storm)
    sse           GET /proto/sse until the `session` event
    stream        POST /proto/stream (HELLO as its body) until the HELLO reply line
    resume        N sessions each with ``replay`` messages after their HELLO reply, all
                  dropped at once, then resumed with last_seq (in memory)
    resume-redis  the same on a private redis-server (REDIS_URL), every message replayed
                  exactly once

Memory per connection: the worker's RSS growth over the held connections (after a
small warm-up storm, so first-use imports and caches are in the base).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

#: bench/run.py, which sets it when it imports this module (its helpers: LineReader,
#: reap, rss_kb, table, SECRET)
RUN: ModuleType = ModuleType("run")  # replaced by bench/run.py on import
BENCH = Path(__file__).resolve().parent
ROWS = ("ws", "sse", "stream", "resume", "resume-redis", "memory")
#: Each row's goal as a ratio of the echo's figure in the same round ("min": at least).
GOALS = {"ws": 0.8, "sse": 0.6, "stream": 0.6, "resume": 0.5, "resume-redis": 0.35}
MEMORY_GOAL = 1.15  # at most this many times the echo's KB per connection
LABELS = {"echo": "echo: gevent + websockets sans-I/O, upgrade only",
          "ws": "WebSocket connect + HELLO round trip", "sse": "SSE connect (`session` event)",
          "stream": "stream open (HELLO reply line)", "resume": "resume, in memory",
          "resume-redis": "resume, on Redis",
          "memory": "WebSocket idle memory, through heartbeats"}


def run_storm(bench: Any, srv: Any, mode: str, n: int, args: Any,
              hold: float = 0.0) -> dict[str, Any]:
    """One bench/storm.py run against ``srv``; after the storm, the RSS and (when held)
    the RSS again ``hold`` seconds later, then the connections are closed."""
    cfg = {"baseUrl": f"http://127.0.0.1:{srv.port}", "mode": mode, "connections": n,
           "proto": srv.spec.proto, "inflight": args.storm_inflight, "secret": RUN.SECRET,
           "serverPid": srv.pid, "clkTck": os.sysconf("SC_CLK_TCK"), "replay": 10,
           "timeout": max(120, n / 20)}
    proc = subprocess.Popen([sys.executable, str(BENCH / "storm.py"), json.dumps(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, cwd=str(BENCH))
    reader = RUN.LineReader(proc)
    try:
        ready = reader.next_json(bench.progress, time.monotonic() + 2 * cfg["timeout"] + 120)
        if ready is None:
            raise RuntimeError(f"storm generator failed: {''.join(reader.stderr)[-2000:]}")
        time.sleep(0.5)
        ready["rss_after_kb"] = RUN.rss_kb(srv.pid)
        if hold:
            until = time.monotonic() + hold
            while time.monotonic() < until:
                time.sleep(0.2)
                bench.progress.tick()
            ready["rss_held_kb"] = RUN.rss_kb(srv.pid)
        stats = srv.stats()
        ready["server_active_connections"] = (stats or {}).get("activeConnections")
        assert proc.stdin is not None
        proc.stdin.write("close\n")
        proc.stdin.flush()
        final = reader.next_json(bench.progress, time.monotonic() + 60) or {}
    finally:
        RUN.reap(proc)
    final.pop("event", None)
    return {**ready, **final}


def one_row(bench: Any, row: str, n: int, args: Any, redis_url: str | None) -> dict[str, Any]:
    """A fresh server for ``row``, warmed up, its base RSS, the storm."""
    spec = bench.specs["gevent-sansio" if row == "echo" else args.storm_server]
    env = dict(spec.env)
    if row != "echo":
        env.update({"MAX_CONNECTIONS": str(2 * n + 1000),
                    "MAX_CONNECTIONS_PER_USER": str(2 * n + 1000)})
    hold = 0.0
    if row == "memory":
        env["HEARTBEAT_INTERVAL"] = str(args.storm_heartbeat_ms)
        hold = args.storm_heartbeat_rounds * args.storm_heartbeat_ms / 1000 + 1.0
    if row == "resume-redis":
        env.update({"REDIS_URL": redis_url or "", "REDIS_PREFIX": f"storm-{os.getpid()}"})
    name = f"storm-{row}"
    bench.specs[name] = replace(spec, name=name, env=env)
    srv = bench.start_servers([name])[name]
    try:
        mode = "ws" if row in ("echo", "memory") else row.replace("-redis", "")
        run_storm(bench, srv, "ws", min(100, n), args)  # first-use imports, caches
        time.sleep(0.3)
        base = RUN.rss_kb(srv.pid)
        r = run_storm(bench, srv, mode, n, args, hold=hold)
        r["rss_base_kb"] = base
        held = r.get("connected") or 0
        if held:
            r["kb_per_conn"] = round((r["rss_after_kb"] - base) / held, 2)
            if "rss_held_kb" in r:
                r["kb_per_conn_held"] = round((r["rss_held_kb"] - base) / held, 2)
        return r
    finally:
        srv.stop()


def measure_storms(bench: Any, args: Any) -> dict[str, Any]:
    """``args.rounds`` rounds of the echo and the selected rows, ratios within each."""
    rows = [r for r in args.storm_rows if r in ROWS]
    redis = None
    if "resume-redis" in rows:
        sys.path.insert(0, str(BENCH.parent))
        from tests.support import PrivateRedis

        redis = PrivateRedis()  # run.py's process is on the generator's CPU, so is Redis
    out: dict[str, Any] = {"n": args.storm, "inflight": args.storm_inflight,
                           "server": args.storm_server,
                           "heartbeat_ms": args.storm_heartbeat_ms,
                           "heartbeat_rounds": args.storm_heartbeat_rounds, "rounds": []}
    try:
        for _ in range(args.rounds):
            rnd: dict[str, Any] = {}
            for row in ["echo", *rows]:
                rnd[row] = one_row(bench, row, args.storm, args,
                                   redis.url if redis is not None else None)
            out["rounds"].append(rnd)
    finally:
        if redis is not None:
            redis.kill()
    return out


def ratios(rnd: dict[str, Any]) -> dict[str, float | None]:
    """One round's ratios: each row's connect rate over the echo's, and the memory."""
    echo = rnd.get("echo", {})
    base = echo.get("connect_per_s")
    out: dict[str, float | None] = {}
    for row in ROWS[:-1]:  # the connect rates (the memory row's storm is no target)
        r = rnd.get(row)
        if r and base and r.get("connect_per_s") and not r.get("failed"):
            out[row] = round(r["connect_per_s"] / base, 3)
        elif r:
            out[row] = None
    cpu = echo.get("server_us_per_connect")
    for row in ROWS[:-1]:  # the same from the server's CPU per connection (less noisy)
        r = rnd.get(row)
        if r and cpu and r.get("server_us_per_connect"):
            out[f"{row} cpu"] = round(cpu / r["server_us_per_connect"], 3)
    held, kb = rnd.get("memory"), echo.get("kb_per_conn")
    if held and kb and held.get("kb_per_conn"):
        worst = max(held["kb_per_conn"], held.get("kb_per_conn_held") or 0)
        out["memory"] = round(worst / kb, 3)
    return out


def storm_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    storm = results.get("storm")
    if not storm or not storm.get("rounds"):
        return []
    per_round = [ratios(r) for r in storm["rounds"]]
    out = []
    n = storm["n"]
    for key in (*ROWS, *(f"{r} cpu" for r in ROWS[:-1])):
        values = [r.get(key) for r in per_round if key in r]
        if not values:
            continue
        ok_values = [v for v in values if v is not None]
        if key.endswith(" cpu"):
            row = key[:-4]
            spread = "-" if not ok_values else f"{statistics.median(ok_values):.2f}x" + (
                f" ({min(ok_values):.2f}-{max(ok_values):.2f})" if len(values) > 1 else "")
            out.append({"target": f"  {LABELS[row]}: echo's server CPU per connection / "
                                  "this row's (info)", "value": spread, "goal": "-",
                        "verdict": "info", "ratios": values})
            continue
        if key == "memory":
            goal, ok = f"<= {MEMORY_GOAL}x", bool(ok_values) and len(ok_values) == len(
                values) and max(ok_values) <= MEMORY_GOAL
            label = f"[29] KB per idle session @{n} (through heartbeats), x echo's"
        else:
            goal = f">= {GOALS[key]}x"
            ok = bool(ok_values) and len(ok_values) == len(values) \
                and min(ok_values) >= GOALS[key]
            label = f"[29] {LABELS[key]} @{n}, x echo's connect rate"
        if key == "resume-redis":
            exact = all(r.get("resume-redis", {}).get("replayed_exactly_once")
                        == r.get("resume-redis", {}).get("resumed") for r in storm["rounds"])
            ok = ok and exact
            label += ", replayed exactly once" if exact else ", NOT exactly once"
        spread = "-" if not ok_values else (
            f"{statistics.median(ok_values):.2f}x" + (
                f" ({min(ok_values):.2f}-{max(ok_values):.2f}, {len(values)} rounds)"
                if len(values) > 1 else ""))
        out.append({"target": label, "value": spread, "goal": goal,
                    "verdict": "PASS" if ok else "FAIL", "ratios": values})
    return out


def storm_table(results: dict[str, Any], markdown: bool) -> str:
    storm = results.get("storm")
    if not storm or not storm.get("rounds"):
        return ""
    rows = []
    for i, rnd in enumerate(storm["rounds"], 1):
        rat = ratios(rnd)
        for row, r in rnd.items():
            extra = ""
            if row.startswith("resume"):
                extra = f"{r.get('replayed_exactly_once')}/{r.get('resumed')} exact"
            rows.append([i, LABELS.get(row, row), r.get("connected"), r.get("failed"),
                         r.get("seconds"), r.get("connect_per_s"), rat.get(row),
                         r.get("server_us_per_connect"), rat.get(f"{row} cpu"),
                         r.get("gen_cpu_pct"),
                         r.get("kb_per_conn"), r.get("kb_per_conn_held"), extra])
    return RUN.table(
        f"Reconnect storms (issue 29): {storm['n']} connections, {storm['inflight']} "
        "handshakes in flight, each row a fresh server",
        ["round", "row", "done", "failed", "s", "per s", "x echo", "server µs/conn",
         "x echo (CPU)", "gen CPU %", "KB/conn", "KB/conn held", "replay"], rows, markdown,
        note=f"'held': after {storm['heartbeat_rounds']} heartbeat rounds of "
             f"{storm['heartbeat_ms']} ms. Ratios are within the round.")
