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


def add_halfway(server) -> None:
    @server.tool()
    def halfway(params, session_id, call_id, srv):
        """Reports 50% and returns."""
        srv.send_tool_update(session_id, call_id, "RUNNING", 50)
        return {"ok": True}


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
    add_halfway(server)
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
    bars = proc.stderr.splitlines()  # not a terminal: a line per TOOL_UPDATE, then done
    assert [bar.split("]")[1].strip() for bar in bars] == \
        ["25.0%", "50.0%", "75.0%", "100.0%", "100.0% done"]
    assert bars[-1] == "[####################] 100.0% done"


def test_call_progress_bar_shows_completion_when_the_tool_stops_short(live):
    """The last TOOL_UPDATE said 50%: the bar still ends complete once TOOL_DONE is in."""
    proc = live("call", "halfway")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["[##########..........]  50.0%",
                                        "[####################] 100.0% done"]
    failed = live("call", "broken")
    assert failed.returncode == 1 and "TOOL_EXECUTION_ERROR" in failed.stderr


def test_call_prints_which_fields_fail_the_schema(live):
    proc = live("call", "add", '{"a": "x", "b": [1]}')
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == ("protoflask call: INVALID_MESSAGE: params.a: 'x' is not of type "
                        "'number' (and 1 more error; inputSchema of 'add')")
    assert lines[1:] == ["  a: 'x' is not of type 'number'", "  b: [1] is not of type 'number'"]


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
    proc = live("stats", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["totalConnections"] >= 1 and "messagesPerSecond" in stats


def test_stats_prints_units(live):
    live("ping", "--count", "1")
    proc = live("stats")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.strip().split(":", 1) for line in proc.stdout.splitlines()[1:])
    rows = {k: v.strip() for k, v in rows.items()}
    assert rows["connections since start"] == "1"
    assert rows["message rate"].endswith(" msg/s")
    assert rows["average latency"].endswith(" ms")
    assert rows["error rate"].endswith(" %")
    assert rows["uptime"].endswith(" s")


def test_stats_has_no_session_options(tmp_path):
    """/stats needs no token and has no transport: the options that did nothing are gone."""
    for dead in ("--token", "--transport"):
        proc = run("stats", dead, "x", tmp_path=tmp_path)
        assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr


def test_tools_lists_the_servers_tools_with_their_schemas(live):
    proc = live("tools", "--transport", "sse")
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("\n\n")
    names = [block.split(":", 1)[0] for block in blocks]
    assert names == sorted(names) and {"add", "echo", "slow", "broken"} <= set(names)
    add = blocks[names.index("add")].splitlines()
    assert add[0] == "add: Adds two numbers."
    assert json.loads(add[1].split("input: ", 1)[1])["required"] == ["a", "b"]
    assert json.loads(add[2].split("output: ", 1)[1])["required"] == ["result"]
    as_json = json.loads(live("tools", "--json").stdout)
    assert {t["name"]: t for t in as_json}["slow"]["inputSchema"]["required"] == ["steps"]


def test_help_is_plain_text_and_complete(tmp_path):
    """No RST markup; every command has a summary and a description; every option a help
    text; no `default None` / `default )` from unset or empty defaults."""
    from protoflask.cli import build_parser

    top = run("--help", tmp_path=tmp_path)
    assert top.returncode == 0
    assert "``" not in top.stdout and ":class:" not in top.stdout
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "serve" in a.choices)
    summaries = {a.dest: a.help for a in sub._choices_actions}
    assert set(summaries) == set(sub.choices) >= {"serve", "token", "ping", "chat", "call",
                                                   "tools", "stats"}
    for name, command in sub.choices.items():
        assert summaries[name], f"{name} has no summary line"
        assert command.description, f"{name} has no description"
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = run(name, "--help", tmp_path=tmp_path).stdout
        for bad in ("``", "default None", "default )", "default: None", "default: )"):
            assert bad not in text, f"`protoflask {name} --help` shows {bad!r}"


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
    # a dev token file left by a `serve --dev` that died: the message says where the URL
    # came from
    (tmp_path / "dev-token.json").write_text(json.dumps(
        {"url": f"http://127.0.0.1:{port}", "token": "t"}))
    stale = run("ping", tmp_path=tmp_path)
    assert stale.returncode == 3
    assert stale.stderr.startswith("protoflask ping: server unreachable:")
    assert f"saved by `protoflask serve --dev` in {tmp_path / 'dev-token.json'}" in stale.stderr


def test_bad_flags(tmp_path):
    proc = run("ping", "--no-such-flag", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    bad_transport = run("chat", "--transport", "carrier-pigeon", tmp_path=tmp_path)
    assert bad_transport.returncode == 2 and "invalid choice" in bad_transport.stderr
    bad_config = run("serve", "--max-connections", "0", tmp_path=tmp_path)
    assert bad_config.returncode == 2 and "maxConnections" in bad_config.stderr


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (Linux /proc/net/tcp{,6})."""
    found: set[str] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def test_quickstart_serve_dev_then_chat(tmp_path):
    """README quickstart: `protoflask serve --dev`, then `protoflask chat` in another
    terminal, with no token or URL handling at all (both come from the file serve saved).
    A development server listens on 127.0.0.1 only, prints its token once and the same
    next steps as the README. Serve's config flags reach the server (the HELLO shows the
    heartbeat interval)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JWT_SECRET", "PROTOFLASK_TOKEN", "PROTOFLASK_URL", "HOST")}
    env["PROTOFLASK_DEV_TOKEN_FILE"] = str(tmp_path / "dev-token.json")
    listener = free_listener()  # a free port for the server
    port = listener.getsockname()[1]
    listener.close()
    serve = subprocess.Popen([*console_script(), "serve", "--dev",
                              "--port", str(port), "--heartbeat-interval", "4321",
                              "--no-enable-logging"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=env)
    try:
        from protoflask.cli import DEV_HINTS

        lines = [wait_for(serve.stdout.readline, within=20, what="serve output")
                 for _ in range(5 + len(DEV_HINTS))]
        url = f"http://127.0.0.1:{port}"
        assert lines[0].startswith(f"protoflask listening on {url}")
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else
        exports = [line for line in lines if line.startswith("export PROTOFLASK_TOKEN=")]
        assert len(exports) == 1
        token = exports[0].split("=", 1)[1].strip()
        # the export line, and the playground link (in its fragment, never sent)
        assert sum(line.count(token) for line in lines) == 2
        assert f"dashboard and playground: {url}/#token={token}\n" in lines
        assert [line.strip() for line in lines[-len(DEV_HINTS):]] == list(DEV_HINTS)
        readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
        for hint in DEV_HINTS:
            assert f"`{hint}`" in readme or f"{hint}  " in readme, \
                f"serve --dev suggests {hint!r}, which the README does not"

        chat = subprocess.run([*console_script(), "chat"], input="hi there\n",
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


class Terminal:
    """A command run on a pseudo-terminal (stdin, stdout and stderr), as a person runs it."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        import pty

        self.primary, secondary = pty.openpty()
        self.proc = subprocess.Popen(args, stdin=secondary, stdout=secondary,
                                     stderr=secondary, env=env)
        os.close(secondary)
        self.seen = b""

    def _read(self) -> None:
        import select

        if select.select([self.primary], [], [], 0.05)[0]:
            try:
                self.seen += os.read(self.primary, 4096)
            except OSError:  # the command exited and closed its side
                pass

    def read_until(self, needle: bytes, count: int = 1) -> None:
        def found() -> bool:
            self._read()
            return self.seen.count(needle) >= count
        try:
            wait_for(found, within=20, what=repr(needle))
        except AssertionError:
            raise AssertionError(f"{needle!r} never showed on the terminal: {self.seen!r}") \
                from None

    def type(self, data: bytes) -> None:
        os.write(self.primary, data)

    def wait(self) -> int:
        code = self.proc.wait(timeout(15))
        for _ in range(5):
            self._read()
        return code

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.primary)


def tty_env(live) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROTOFLASK_URL"}
    env["PROTOFLASK_TOKEN"] = live.server.issue_token("tty")
    env["PROTOFLASK_DEV_TOKEN_FILE"] = "/nonexistent/dev-token.json"
    return env


def test_chat_prompts_on_a_terminal(live):
    """On a terminal, chat shows a `you> ` prompt, prints the reply as `agent> ...` and
    prompts again (docs/CLIENT.md)."""
    term = Terminal([*console_script(), "chat", "--url", live.server.base_url], tty_env(live))
    try:
        term.read_until(b"you> ")
        term.type(b"hello tty\n")
        term.read_until(b"agent> hello tty")
        term.read_until(b"you> ", count=2)
        term.type(b"\x04")  # Ctrl-D
        assert term.wait() == 0
    finally:
        term.close()


def test_call_bar_on_a_terminal_ends_complete(live):
    """On a terminal the bar is redrawn in place and, once the result is in, left drawn
    full with `done` (the tool's last update said 50%)."""
    term = Terminal([*console_script(), "call", "halfway", "--url", live.server.base_url],
                    tty_env(live))
    try:
        assert term.wait() == 0
        screen = term.seen.decode()
        assert "[##########..........]  50.0%" in screen
        last = screen.split("\r\x1b[K")[-1]  # what is left on the line after the redraws
        assert last.startswith("[####################] 100.0% done\r\n"), screen
        assert '"ok": true' in last
    finally:
        term.close()
