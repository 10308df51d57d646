"""What one /dashboard/data poll with a token costs on Redis as the cluster's session
records grow, without the 1 s reuse of answers: the session list reads every session
record (SCAN of {prefix}:s:*, bounded at 10,000 records) to find the user's own sessions
held by other nodes.

    python bench/dashboard_cluster.py [--records 1000,10000,20000] [--redis URL]

Uses its own key prefix on the given Redis and deletes it afterwards."""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import orjson
import redis
import requests

from protoflask import ProtoServer


def fake_state(session_id: str, user: str) -> bytes:
    return orjson.dumps({"v": 1, "id": session_id, "user": user, "handshake": True,
                         "last_activity": int(time.time() * 1000), "upstream_seq": 3,
                         "downstream_seq": 5, "last_ack": 5, "runs": []})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="1000,10000,20000")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"pfbench-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(args.redis)
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "enableLogging": False,
                          "jwtSecret": "bench-secret-that-is-long-enough-for-hs256",
                          "redisUrl": args.redis, "redisPrefix": prefix})
    server.start()
    # the scan's own cost: no reuse of answers (the server reuses them for 1 s, so any
    # number of open dashboards costs at most one such scan per second and process)
    server.hub.ELSEWHERE_CACHE_S = 0
    url = f"http://127.0.0.1:{server.port}/dashboard/data"
    headers = {"Authorization": f"Bearer {server.issue_token('alice')}"}
    written = 0
    try:
        for target in (int(n) for n in args.records.split(",")):
            pipe = r.pipeline(transaction=False)
            while written < target:
                sid = uuid.uuid4().hex
                user = "alice" if written % 1000 == 0 else f"user{written}"
                pipe.hset(f"{prefix}:s:{sid}", mapping={
                    "user": user, "node": "", "connected": 0, "transport": "",
                    "state": fake_state(sid, user)})
                written += 1
            pipe.execute()
            times = []
            for _ in range(10):
                started = time.perf_counter()
                body = requests.get(url, headers=headers, timeout=30).json()
                times.append(time.perf_counter() - started)
            print(f"{target:>6} session records: poll median {statistics.median(times) * 1000:7.1f}"
                  f" ms, max {max(times) * 1000:7.1f} ms; alice's listed {body['sessionsListed']}"
                  f", complete {body['sessionsComplete']}")
    finally:
        server.stop()
        keys = list(r.scan_iter(f"{prefix}:*", count=1000))
        for n in range(0, len(keys), 1000):
            r.delete(*keys[n:n + 1000])


if __name__ == "__main__":
    main()
