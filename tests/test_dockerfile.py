"""The Dockerfile runs the server as an unprivileged user and declares a HEALTHCHECK whose
command works: run here (no Docker daemon needed) against a live server, a draining one
and a dead port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from .support import ROOT, free_listener, timeout, wait_for

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    joined = DOCKERFILE.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_server_does_not_run_as_root():
    steps = instructions()
    users = [i for i, (word, _) in enumerate(steps) if word == "USER"]
    cmd = max(i for i, (word, _) in enumerate(steps) if word == "CMD")
    assert users and users[-1] < cmd, "no USER before CMD: the server would run as root"
    user = steps[users[-1]][1]
    assert user not in ("root", "0", "0:0")
    assert any(word == "RUN" and "useradd" in args and (user in args) for word, args in steps)


def healthcheck_command() -> list[str]:
    (args,) = [args for word, args in instructions() if word == "HEALTHCHECK"]
    assert "CMD " in args, args
    command = json.loads(args.split("CMD ", 1)[1])  # the exec form: no shell in the way
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


def run_check(port: int) -> int:
    env = {**os.environ, "PORT": str(port)}
    return subprocess.run(healthcheck_command(), env=env, capture_output=True,
                          timeout=timeout(30)).returncode


def test_the_healthcheck_command_tells_healthy_from_not(make_server):
    server = make_server()
    assert run_check(server.port) == 0
    # draining (a tool call keeps it draining): /health answers 503, the check fails
    from .hardening_support import sleeping_tool

    server.register_tool(sleeping_tool())
    from .support import WSClient

    client = WSClient(server.base_url, server.issue_token("hc"))
    client.hello()
    client.send("TOOL_CALL", payload={"call_id": "t", "tool": "sleep",
                                      "params": {"seconds": 2.0}})
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 5.0})
    stopper.start()
    try:
        wait_for(lambda: run_check(server.port) != 0, within=10, what="the check to fail")
    finally:
        stopper.join(timeout(15))
        client.close()
    listener = free_listener()
    dead = listener.getsockname()[1]
    listener.close()
    assert run_check(dead) != 0
