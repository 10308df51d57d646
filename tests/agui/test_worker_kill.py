"""A re-attached AG-UI stream whose worker is SIGKILLed (a Redis cluster of gunicorn
processes): the client re-attaches with Last-Event-ID on another worker and ends with
exactly the events of an uncut run.

The run's handler runs on node a (where the run was posted); the client's stream was cut
and re-attached on node b, which now holds the thread's session; b dies (worker and
master) while the handler pauses between two bursts. The client re-attaches on node c,
which takes the session over from the dead node's journal while a's handler goes on
streaming into it through the cluster. The client sees chunk5 and b dies at once,
often before its confirmation of chunk5 reaches a: a's delivery is then queued again
for the next holder, which skips the copy by its id when b had it (before, the
unconfirmed delivery was an error: stream_text stopped as if the session were gone,
and the run ended without the rest and with a made-up TEXT_MESSAGE_END; 1 run in 5;
tests/cluster/test_unconfirmed_delivery.py makes both cases certain)."""

from __future__ import annotations

import os
import signal
from typing import Any

import requests

from protoflask.auth import TokenAuthority

from ..support import SECRET, GunicornServer, timeout, wait_for
from .test_endpoint import blocks

APP = "tests.fixtures.agui_app:app"


def stats(base_url: str) -> dict[str, Any]:
    return requests.get(base_url + "/stats", timeout=timeout(5)).json()


def read_events(response: requests.Response, count: int) -> list[tuple[int | None, Any]]:
    """The first ``count`` events of a streaming response (then the caller drops it)."""
    buffer = b""
    for chunk in response.iter_content(None):
        buffer += chunk
        if buffer.count(b"\n\n") >= count:
            break
    return blocks(b"".join(block + b"\n\n" for block in buffer.split(b"\n\n")[:count]))


def test_a_reattached_stream_whose_worker_is_killed_resumes_on_a_third(redis_url, prefix):
    env = {"REDIS_URL": redis_url, "REDIS_PREFIX": prefix, "HEARTBEAT_INTERVAL": "600000"}
    a, b, c = (GunicornServer(env, app=APP) for _ in range(3))
    try:
        wait_for(lambda: len(stats(c.base_url).get("nodes", [])) == 3, within=15,
                 what="three nodes in the cluster")
        token = TokenAuthority(SECRET, ("HS256",), "1h").issue("u")
        auth = {"Authorization": f"Bearer {token}"}

        def post(base: str, thread: str) -> requests.Response:
            return requests.post(f"{base}/proto/agui", stream=True, timeout=timeout(30),
                                 headers=auth, json={"threadId": thread, "runId": "r1",
                                                     "messages": [{"id": "m", "role": "user",
                                                                   "content": "pause"}]})

        uncut = blocks(post(a.base_url, "uncut").content)
        assert uncut[-1][1]["type"] == "RUN_FINISHED"

        with post(a.base_url, "killed") as first:
            got = read_events(first, 4)
        with requests.get(f"{b.base_url}/proto/agui", params={"thread": "killed", "run": "r1"},
                          headers={**auth, "Last-Event-ID": str(got[-1][0])}, stream=True,
                          timeout=timeout(30)) as second:
            # the prelude (2) and the first burst's last 4 contents, then the pause
            more = read_events(second, 6)
            assert more[-1][1].get("delta") == "chunk5 "
            worker = requests.get(b.base_url + "/test/pid", timeout=timeout(5)).json()["pid"]
            os.kill(worker, signal.SIGKILL)  # node b dies with the stream and the session
            b.kill()
        assert [e["type"] for i, e in more if i is None] == ["RUN_STARTED",
                                                             "TEXT_MESSAGE_START"]
        got += [(i, e) for i, e in more if i is not None]

        def third() -> requests.Response | None:
            r = requests.get(f"{c.base_url}/proto/agui",
                             params={"thread": "killed", "run": "r1"}, timeout=timeout(30),
                             headers={**auth, "Last-Event-ID": str(got[-1][0])})
            return r if r.status_code == 200 else None
        rest = blocks(wait_for(third, within=20, what="the re-attach on node c").content)
        assert [e["type"] for i, e in rest if i is None] == ["RUN_STARTED",
                                                             "TEXT_MESSAGE_START"]
        got += [(i, e) for i, e in rest if i is not None]
        ids = [i for i, _ in got]
        assert ids == sorted(set(ids))

        def shape(events: list[Any]) -> list[tuple[str, Any, Any]]:
            return [(e["type"], e.get("delta"), e.get("result")) for e in events]
        assert shape([e for _, e in got]) == shape([e for _, e in uncut])
    finally:
        for server in (a, b, c):
            server.stop()
