"""The command-line client against a WSGI server that cannot keep a response streaming:
the Flask dev server running an app with protoflask mounted (`flask --app ... run`, a
Flask user's first reflex). Every transport gets the same clear refusal, never a
traceback or a timeout."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from ..support import ROOT, SECRET, free_listener, timeout, wait_for
from .conftest import TRANSPORTS
from .test_cli_commands import run


@pytest.fixture(scope="module")
def flask_dev_server():
    listener = free_listener()
    port = listener.getsockname()[1]
    listener.close()
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "app.py", "run",
                             "--port", str(port)], cwd=ROOT / "examples" / "embed",
                            env={"JWT_SECRET": SECRET, "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return requests.get(f"{url}/health", timeout=1).ok
        except requests.ConnectionError:
            return False
    try:
        wait_for(up, within=timeout(20), what="the Flask dev server")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout(10))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_on_the_flask_dev_server_says_unsupported_server(flask_dev_server, transport,
                                                              tmp_path):
    from protoflask import ProtoServer

    token = ProtoServer({"jwtSecret": SECRET, "port": 0}).issue_token("dev-user")
    proc = run("chat", "--url", flask_dev_server, "--token", token, "--transport", transport,
               "--timeout", "20", stdin="hi\n", tmp_path=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("protoflask chat: HTTP 500 UNSUPPORTED_SERVER:"), proc.stderr
    assert "gevent worker" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
