"""protoflask.client under gevent: a monkey-patched program runs the server and three
clients (one per transport) as greenlets in one hub. If the client blocked the hub
anywhere, the server could not answer and the script would time out. The test suite
itself is not monkey-patched, hence the subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from ..support import ROOT, SECRET, timeout

SCRIPT = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()

    import json
    import gevent
    from protoflask import ProtoServer
    from protoflask.client import Client, ToolError

    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": %(secret)r,
                          "enableLogging": False, "heartbeatInterval": 100,
                          "heartbeatTimeout": 400})

    @server.tool(input_schema={"type": "object"})
    def slow(params, session_id, call_id, srv):
        for step in (1, 2, 3):
            gevent.sleep(0.01)
            srv.send_tool_update(session_id, call_id, "RUNNING", step * 33)
        return {"done": True}

    server.start()
    url = f"http://127.0.0.1:{server.port}"

    def session(transport):
        client = Client(url, server.issue_token("g-" + transport), transport=transport,
                        timeout=5).connect()
        out = {"session": bool(client.session_id)}
        client.send_text("hi " + transport)
        out["text"] = client.next_text(5).text
        progress = []
        out["result"] = client.call_tool("slow", {}, on_progress=lambda p, s, x: progress.append(p),
                                         timeout=5)
        out["progress"] = progress
        try:
            client.call_tool("nope", {}, timeout=5)
        except ToolError as exc:
            out["error"] = exc.code
        client.drop_connection()
        client.send_text("after the drop")
        out["after"] = client.next_text(10).text
        gevent.sleep(0.5)  # several heartbeats, answered by the client's greenlets
        out["reconnects"] = client.reconnects
        out["rtt"] = client.ping(5) > 0
        client.close()
        return out

    jobs = [gevent.spawn(session, t) for t in ("ws", "sse", "stream")]
    gevent.joinall(jobs, timeout=30, raise_error=True)
    print(json.dumps({t: job.value for t, job in zip(("ws", "sse", "stream"), jobs)}))
    server.stop()
""") % {"secret": SECRET}


def test_client_under_gevent_monkey_patching():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout(60))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for transport in ("ws", "sse", "stream"):
        assert results[transport] == {
            "session": True, "text": f"hi {transport}", "result": {"done": True},
            "progress": [33, 66, 99], "error": "TOOL_NOT_FOUND",
            "after": "after the drop", "reconnects": 1, "rtt": True,
        }, (transport, results[transport])
