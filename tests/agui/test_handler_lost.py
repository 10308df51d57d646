"""An AG-UI run whose handler dies with its worker (a Redis cluster of gunicorn processes)
ends with RUN_ERROR rather than staying active with no one to end it (agui/lost.py): the
client, re-attached on another node, gets the rest of what was sent, the ENDs of what was
open, and the terminal RUN_ERROR; the body then closes, and the thread takes a new run."""

from __future__ import annotations

import os
import signal

import requests

from protoflask.auth import TokenAuthority

from ..support import SECRET, GunicornServer, timeout, wait_for
from .test_endpoint import blocks
from .test_worker_kill import APP, read_events, stats


def test_a_run_whose_handler_worker_dies_ends_with_run_error(redis_url, prefix):
    env = {"REDIS_URL": redis_url, "REDIS_PREFIX": prefix, "HEARTBEAT_INTERVAL": "600000"}
    a, b = (GunicornServer(env, app=APP) for _ in range(2))
    try:
        wait_for(lambda: len(stats(b.base_url).get("nodes", [])) == 2, within=15,
                 what="two nodes in the cluster")
        token = TokenAuthority(SECRET, ("HS256",), "1h").issue("u")
        auth = {"Authorization": f"Bearer {token}"}
        body = {"threadId": "lost", "runId": "r1",
                "messages": [{"id": "m", "role": "user", "content": "pause"}]}
        with requests.post(f"{a.base_url}/proto/agui", stream=True, timeout=timeout(30),
                           headers=auth, json=body) as first:
            got = read_events(first, 4)  # in the first burst; the pause follows it
            worker = requests.get(a.base_url + "/test/pid", timeout=timeout(5)).json()["pid"]
            os.kill(worker, signal.SIGKILL)  # node a dies with the run's handler
            a.kill()

        def reattach() -> requests.Response | None:
            r = requests.get(f"{b.base_url}/proto/agui", params={"thread": "lost", "run": "r1"},
                             headers={**auth, "Last-Event-ID": str(got[-1][0])},
                             timeout=timeout(30))
            return r if r.status_code == 200 else None
        rest = blocks(wait_for(reattach, within=20, what="the re-attach on node b").content)
        events = [e for _, e in got] + [e for i, e in rest if i is not None or
                                          e["type"] in ("TEXT_MESSAGE_END", "RUN_ERROR")]
        assert events[-1]["type"] == "RUN_ERROR"
        assert events[-1]["code"] == "INTERNAL_ERROR" and "lost" in events[-1]["message"]
        assert [e["type"] for e in events].count("TEXT_MESSAGE_END") == 1
        # the run ended: the thread takes the next one (no "has an active run")
        again = requests.post(f"{b.base_url}/proto/agui", timeout=timeout(30), headers=auth,
                              json={**body, "runId": "r2", "messages": [
                                  {"id": "m2", "role": "user", "content": "hi"}]})
        assert again.status_code == 200
        assert blocks(again.content)[-1][1]["type"] == "RUN_FINISHED"
    finally:
        for server in (a, b):
            server.stop()
