"""The client commands of the ``protoflask`` console script, run in a subprocess against a
real server: ping, call (with its progress bar), stats, chat over each transport, and
the one-line errors with their exit codes. Plus the README quickstart end to end:
``protoflask serve --dev`` then ``protoflask chat`` with no token handling at all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import free_listener, timeout, wait_for
from .conftest import TRANSPORTS, add_tools


def console_script() -> list[str]:
    script = Path(sys.executable).parent / "protoflask"
    if script.exists():
        return [str(script)]
    found = shutil.which("protoflask")
    return [found] if found else [sys.executable, "-m", "protoflask.cli"]


def run(*args: str, stdin: str = "", env: dict[str, str] | None = None,
        tmp_path: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PROTOFLASK_TOKEN",
                                                                  "PROTOFLASK_URL")}
    if tmp_path is not None:  # no dev token from a real `serve --dev` on this machine
        full_env["PROTOFLASK_DEV_TOKEN_FILE"] = str(tmp_path / "dev-token.json")
    full_env.update(env or {})
    return subprocess.run([*console_script(), *args], input=stdin, capture_output=True,
                          text=True, env=full_env, timeout=timeout(60))


@pytest.fixture
def live(make_server, tmp_path):
    server = make_server()
    add_tools(server)
    token = server.issue_token("cli")

    def cli(*args: str, stdin: str = "", token: str | None = token) -> subprocess.CompletedProcess:
        env = {"PROTOFLASK_TOKEN": token} if token else {}
        return run(*args, "--url", server.base_url, stdin=stdin, env=env, tmp_path=tmp_path)

    cli.server = server  # type: ignore[attr-defined]
    return cli


def test_ping(live):
    proc = live("ping", "--count", "3", "--interval", "0")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("pong")] == \
        ["pong 1", "pong 2", "pong 3"]
    assert lines[-1].startswith("3 pongs, min/avg/max = ")


def test_call_shows_progress_and_prints_the_result(live):
    proc = live("call", "slow", '{"steps": 4}', "--transport", "sse")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"steps": 4}
    bars = proc.stderr.splitlines()  # not a terminal: a line per TOOL_UPDATE
    assert [bar.split("]")[1].strip() for bar in bars] == ["25.0%", "50.0%", "75.0%", "100.0%"]
    assert bars[-1].startswith("[####################]")


def test_call_errors_carry_the_contract_code(live):
    unknown = live("call", "nope")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "protoflask call: TOOL_NOT_FOUND: no tool named 'nope'"
    invalid = live("call", "add", '{"a": "x"}')
    assert invalid.returncode == 1 and "INVALID_MESSAGE" in invalid.stderr
    not_json = live("call", "add", "{oops")
    assert not_json.returncode == 2 and "params are not JSON" in not_json.stderr


def test_stats(live):
    live("ping", "--count", "1")
    proc = live("stats")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["totalConnections"] >= 1 and "messagesPerSecond" in stats


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_with_piped_stdin(live, transport):
    proc = live("chat", "--transport", transport, stdin="hello\n\nsecond line\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["hello", "second line"]


def test_bad_token_is_one_line_with_the_code(live):
    proc = live("ping", token="not-a-jwt")
    assert proc.returncode == 3
    assert proc.stderr.startswith("protoflask ping: HTTP 401 INVALID_TOKEN:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_no_token_says_how_to_get_one(live):
    proc = live("chat", token=None)
    assert proc.returncode == 2 and "no token" in proc.stderr


def test_unreachable_server(tmp_path):
    listener = free_listener()
    port = listener.getsockname()[1]
    listener.close()
    proc = run("ping", "--url", f"http://127.0.0.1:{port}", "--token", "t", tmp_path=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.startswith("protoflask ping: server unreachable:")
    stats = run("stats", "--url", f"http://127.0.0.1:{port}", tmp_path=tmp_path)
    assert stats.returncode == 3 and "unreachable" in stats.stderr


def test_bad_flags(tmp_path):
    proc = run("ping", "--no-such-flag", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    bad_transport = run("chat", "--transport", "carrier-pigeon", tmp_path=tmp_path)
    assert bad_transport.returncode == 2 and "invalid choice" in bad_transport.stderr
    bad_config = run("serve", "--max-connections", "0", tmp_path=tmp_path)
    assert bad_config.returncode == 2 and "maxConnections" in bad_config.stderr


def test_quickstart_serve_dev_then_chat(tmp_path):
    """README quickstart: `protoflask serve --dev`, then `protoflask chat` in another
    terminal, with the dev token picked up from the file serve saved. Serve's config
    flags reach the server (the HELLO shows the heartbeat interval)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JWT_SECRET", "PROTOFLASK_TOKEN", "PROTOFLASK_URL")}
    env["PROTOFLASK_DEV_TOKEN_FILE"] = str(tmp_path / "dev-token.json")
    listener = free_listener()  # a free port for the server
    port = listener.getsockname()[1]
    listener.close()
    serve = subprocess.Popen([*console_script(), "serve", "--dev", "--host", "127.0.0.1",
                              "--port", str(port), "--heartbeat-interval", "4321",
                              "--no-enable-logging"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=env)
    try:
        lines = [wait_for(serve.stdout.readline, within=20, what="serve output")
                 for _ in range(7)]
        assert lines[0].startswith(f"protoflask listening on http://127.0.0.1:{port}")
        token = lines[2].strip()
        assert f"dashboard: http://127.0.0.1:{port}/#token={token}\n" in lines
        assert f"export PROTOFLASK_TOKEN={token}\n" in lines
        url = f"http://127.0.0.1:{port}"
        chat = subprocess.run([*console_script(), "chat", "--url", url], input="hi there\n",
                              capture_output=True, text=True, env=env, timeout=timeout(60))
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout == "hi there\n"

        from protoflask.client import connect

        with connect(url, token, timeout=timeout(5)) as client:
            assert client.server_hello["capabilities"]["heartbeat_interval_ms"] == 4321
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout(15)) == 0
        assert not (tmp_path / "dev-token.json").exists()  # forgotten when serve stops
    finally:
        serve.kill()
        serve.wait()
