"""What a new user reaches for in the first hour, run as they would run it: the entry
points (`python -m protoflask`, `--version`, bare `protoflask`), `checktoken`, `config`
with each value's source, plain errors (a URL without a scheme, a dead port, a short
secret), and the development servers: `serve --app module:proto` (and `--reload`),
`PROTOFLASK_DEV=1 python app.py`, and two `serve --dev` that keep their own tokens."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from protoflask.auth import TokenAuthority

from ..support import SECRET, free_listener, timeout, wait_for
from .test_cli_commands import _listening_addresses, console_script, run


def free_port() -> int:
    listener = free_listener()
    port = listener.getsockname()[1]
    listener.close()
    return port


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JWT_SECRET", "PROTOFLASK_TOKEN", "PROTOFLASK_URL", "HOST", "PORT",
                        "PROTOFLASK_DEV")}
    env["PROTOFLASK_DEV_TOKEN_FILE"] = str(tmp_path / "dev-token.json")
    env.update(extra)
    return env


class Served:
    """A long-running command (a server) whose stdout lines are read as they come."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=cwd, start_new_session=True)
        self.lines: list[str] = []

    def read_until(self, needle: str) -> str:
        def found() -> str | None:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            if not line and self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.lines}")
            self.lines.append(line)
            return line if needle in line else None
        return wait_for(found, within=30, what=needle)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout(20))
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def test_entry_points(tmp_path):
    module = subprocess.run([sys.executable, "-m", "protoflask", "--version"],
                            capture_output=True, text=True, timeout=timeout(60))
    from protoflask import __version__

    assert module.returncode == 0 and module.stdout.strip() == f"protoflask {__version__}"
    assert run("--version", tmp_path=tmp_path).stdout.strip() == f"protoflask {__version__}"
    bare = run(tmp_path=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.startswith("usage: protoflask") and "checktoken" in bare.stdout


def test_checktoken(tmp_path):
    token = TokenAuthority(SECRET).issue("alice")
    good = run("checktoken", token, env={"JWT_SECRET": SECRET}, tmp_path=tmp_path)
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("valid: user 'alice' (HS256)")
    assert json.loads(good.stdout[good.stdout.index("{"):])["sub"] == "alice"
    bad = run("checktoken", token, env={"JWT_SECRET": "another-secret-" * 3},
              tmp_path=tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("invalid: INVALID_TOKEN")
    import jwt

    expired = jwt.encode({"sub": "alice", "exp": 1000}, SECRET, algorithm="HS256")
    old = run("checktoken", expired, env={"JWT_SECRET": SECRET}, tmp_path=tmp_path)
    assert old.returncode == 1 and "INVALID_TOKEN" in old.stderr
    nothing = run("checktoken", token, env={"JWT_SECRET": ""}, tmp_path=tmp_path)
    assert nothing.returncode == 2 and "JWT_SECRET" in nothing.stderr


def test_config_shows_each_value_and_its_source(tmp_path):
    proc = run("config", "--json", "--port", "9123", tmp_path=tmp_path,
               env={"HEARTBEAT_INTERVAL": "4321", "JWT_SECRET": SECRET})
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["port"] == {"value": 9123, "source": "--port"}
    assert shown["heartbeatInterval"] == {"value": 4321, "source": "env HEARTBEAT_INTERVAL"}
    assert shown["maxConnections"]["source"] == "default"
    assert shown["jwtSecret"] == {"value": "(set, not shown)", "source": "env JWT_SECRET"}
    assert SECRET not in proc.stdout
    dev = json.loads(run("config", "--json", "--dev", tmp_path=tmp_path).stdout)
    assert dev["host"] == {"value": "127.0.0.1", "source": "--dev"}
    text = run("config", tmp_path=tmp_path, env={"JWT_SECRET": SECRET}).stdout
    assert any(line.split() == ["heartbeatInterval", "30000", "(default)"]
               for line in text.splitlines())


def test_plain_errors_for_the_url(tmp_path):
    no_scheme = run("ping", "--url", "127.0.0.1:8080", tmp_path=tmp_path)
    assert no_scheme.returncode == 2
    assert "has no scheme: use http://127.0.0.1:8080" in no_scheme.stderr
    dead = run("ping", "--url", f"http://127.0.0.1:{free_port()}", tmp_path=tmp_path)
    assert dead.returncode == 3, dead.stderr
    assert dead.stderr.startswith("protoflask ping: server unreachable:"), dead.stderr


def test_a_short_secret_is_named_plainly(tmp_path, caplog):
    proc = run("token", "--user", "u", "--secret", "abc", tmp_path=tmp_path)
    assert proc.returncode == 0 and proc.stdout.count(".") == 2
    assert proc.stderr.startswith("protoflask token: warning: the JWT secret is only 3 bytes")
    assert "site-packages" not in proc.stderr and "Warning:" not in proc.stderr
    from protoflask import ProtoServer

    with caplog.at_level(logging.WARNING, logger="protoflask"):
        ProtoServer({"jwtSecret": "abc", "port": 0})
    assert any("only 3 bytes" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="protoflask"):
        ProtoServer({"jwtSecret": SECRET, "port": 0})
    assert not any("bytes" in r.getMessage() for r in caplog.records)


def test_ping_grammar(make_server, tmp_path):
    server = make_server()
    proc = run("ping", "--url", server.base_url, "--count", "1",
               "--token", server.issue_token("g"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("1 pong, min/avg/max")


def test_two_dev_servers_keep_their_own_tokens(tmp_path, served):
    env = clean_env(tmp_path)
    urls = []
    for _ in range(2):
        port = free_port()
        s = Served([*console_script(), "serve", "--dev", "--port", str(port),
                    "--no-enable-logging"], env)
        served.append(s)
        s.read_until("listening on")
        link = s.read_until("dashboard and playground:")
        urls.append(f"http://127.0.0.1:{port}")
        assert f"{urls[-1]}/#token=" in link  # the playground link, token in its fragment
    for url in urls:  # each client command finds its own server's token
        assert run("ping", "--url", url, "--count", "1", env=env).returncode == 0
    assert served[1].stop() == 0  # the second one stops: the first one's token stays
    first = run("ping", "--url", urls[0], "--count", "1", env=env)
    assert first.returncode == 0, first.stderr
    assert served[0].stop() == 0
    assert not (tmp_path / "dev-token.json").exists()


APP = """
from protoflask import ProtoServer

proto = ProtoServer()

@proto.tool()
def version(params, session_id, call_id, server):
    \"\"\"Which version of this file runs.\"\"\"
    return {"version": VERSION}
"""


def test_serve_app_with_reload(tmp_path, served):
    (tmp_path / "myapp.py").write_text(APP.replace("VERSION", "1"))
    env = clean_env(tmp_path)
    port = free_port()
    s = Served([*console_script(), "serve", "--app", "myapp:proto", "--dev", "--reload",
                "--port", str(port), "--no-enable-logging"], env, cwd=tmp_path)
    served.append(s)
    s.read_until("listening on")
    url = f"http://127.0.0.1:{port}"
    token = json.loads((tmp_path / "dev-token.json").read_text())["servers"][-1]["token"]
    first = run("call", "version", "--url", url, env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"version": 1}
    assert _listening_addresses(port) == {"0100007F"}  # --dev: 127.0.0.1 only

    (tmp_path / "myapp.py").write_text(APP.replace("VERSION", "2"))
    s.read_until("restarting")
    s.read_until("listening on")

    def second() -> bool:
        proc = run("call", "version", "--url", url, "--token", token, env=env)
        return proc.returncode == 0 and json.loads(proc.stdout) == {"version": 2}
    wait_for(second, within=30, what="the reloaded tool, with the same token")
    assert s.stop() == 0


def test_serve_app_refuses_what_is_not_a_server(tmp_path):
    (tmp_path / "notapp.py").write_text("proto = 42\n")
    env = clean_env(tmp_path)
    proc = subprocess.run([*console_script(), "serve", "--app", "notapp:proto", "--dev"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout(60))
    assert proc.returncode == 2 and "not a ProtoServer" in proc.stderr
    missing = subprocess.run([*console_script(), "serve", "--app", "nosuchmodule:proto"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=timeout(60))
    assert missing.returncode == 2 and "cannot import 'nosuchmodule'" in missing.stderr


def test_protoflask_dev_in_a_plain_script(tmp_path, served):
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent("""
        from protoflask import ProtoServer
        server = ProtoServer({"port": 0, "enableLogging": False})
        server.start()
        print(f"port: {server.port}", flush=True)
        server.serve_forever()
    """))
    env = clean_env(tmp_path, PROTOFLASK_DEV="1")
    s = Served([sys.executable, str(script)], env, cwd=tmp_path)
    served.append(s)
    port = int(s.read_until("port:").split(":")[1])
    assert _listening_addresses(port) == {"0100007F"}  # not 0.0.0.0
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: (tmp_path / "dev-token.json").exists(), what="the saved token")
    proc = run("ping", "--url", url, "--count", "1", env=env)  # no token handling at all
    assert proc.returncode == 0, proc.stderr
    assert s.stop() == 0
    assert not (tmp_path / "dev-token.json").exists()


def test_chat_ctrl_c_cancels_the_run_and_a_second_quits(make_server):
    """Ctrl-C while a reply streams (in a run) cancels that run and stops printing it,
    then prompts again; Ctrl-C at the prompt quits (130)."""
    import gevent

    from .test_cli_commands import Terminal

    server = make_server(echoMessages=False)
    outcomes: list = []

    def reply(session_id: str, message: dict) -> None:
        if message["type"] != "MESSAGE_END":
            return

        def slow_model():
            for i in range(400):
                gevent.sleep(0.05)
                yield f"t{i} "

        def stream() -> None:
            run = server.start_run(session_id)
            outcomes.append(server.stream_text(session_id, slow_model(), run_id=run["runId"]))
        gevent.spawn(stream)

    server.on("textMessage", reply)
    env = {k: v for k, v in os.environ.items() if k != "PROTOFLASK_URL"}
    env["PROTOFLASK_TOKEN"] = server.issue_token("tty")
    env["PROTOFLASK_DEV_TOKEN_FILE"] = "/nonexistent/dev-token.json"
    term = Terminal([*console_script(), "chat", "--url", server.base_url, "--wait", "60"], env)
    try:
        term.read_until(b"you> ")
        term.type(b"tell me a long story\n")
        term.read_until(b"agent> t0 ")
        term.proc.send_signal(signal.SIGINT)
        term.read_until(b"1 run(s) cancelled")
        term.read_until(b"you> ", count=2)
        wait_for(lambda: outcomes, what="the streamed reply to end")
        assert outcomes[0].stopped, "the run's stream went on after the cancel"
        assert outcomes[0].parts < 400
        term.proc.send_signal(signal.SIGINT)
        assert term.wait() == 130
    finally:
        term.close()


def test_call_shows_partial_results(make_server, tmp_path):
    server = make_server()

    @server.tool()
    def drafting(params, session_id, call_id, srv):
        """Reports partial results."""
        srv.send_tool_update(session_id, call_id, "RUNNING", 50, partial={"draft": "Dear"})
        return {"text": "Dear reader"}

    proc = run("call", "drafting", "--url", server.base_url,
               "--token", server.issue_token("p"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '50.0%  partial: {"draft": "Dear"}' in proc.stderr
    assert json.loads(proc.stdout) == {"text": "Dear reader"}
