"""Every shell and JavaScript/TypeScript block of README.md, docs/*.md and
clients/js/README.md runs as written, or says why not and where it is run instead.

The marker on the line before a fence (as for the Python blocks, tests/docs/test_snippets.py)
says how a block is run:

    (none), a sh block            run with bash from the repository root, stdin empty, with
                                  PROTOFLASK_URL / PROTOFLASK_TOKEN of a live server (and
                                  JWT_SECRET, PORT, HOST) set; it must exit 0
    <!-- snippet: server (...) -->  sh: starts a server on $HOST:$PORT that does not return;
                                  it must answer /health, protoflask's refusal of a token it
                                  did not sign (the block makes its own secret), and stop
                                  on SIGTERM
    <!-- snippet: ci (...) -->      sh: every command line is a line of .ci/run, which
                                  runs it
    <!-- snippet: node (...) -->    js/ts: run by Node (an ES module) with the built client
                                  importable as "protoflask-client", and "ws"; it must exit 0
    <!-- snippet: browser (EXPR) --> js: run in Chromium in a page of the live server, with
                                  `token` defined; EXPR (JavaScript, over the block's own
                                  names) must become true
    <!-- snippet: skip (reason) -->  not run: the reason says why and what runs it instead

A JavaScript block without a marker fails: it must say where it runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from protoflask import ProtoServer

from ..support import ROOT, SECRET, built_js_client, timeout
from .test_snippets import (
    RUN_TIMEOUT, Snippet, _text, extract, free_port, run_server, snippet_env,
)

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "clients" / "js" / "README.md"]
FENCES = re.compile(r"^(\s*)```(sh|bash|shell|js|javascript|mjs|ts|typescript)\s*$")
SHELL = {"sh", "bash", "shell"}
KINDS = {"skip", "server", "ci", "node", "browser"}
CLIENT = ROOT / "clients" / "js"
CI = ROOT / ".ci" / "run"

SNIPPETS = [snippet for doc in DOCS for snippet in extract(doc, FENCES)]


def failure(snippet: Snippet, what: str, out: str = "", err: str = "") -> str:
    return (f"the {snippet.language} block at {snippet.where} {what}.\nIt must run as "
            "written (see tests/docs/test_shell_js_snippets.py for the markers).\n"
            f"--- code ---\n{snippet.code}--- stdout ---\n{out[-3000:]}\n"
            f"--- stderr ---\n{err[-3000:]}")


@pytest.fixture(scope="module")
def live() -> Iterator[ProtoServer]:
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_extractor_finds_every_language() -> None:
    languages = {s.language for s in SNIPPETS}
    assert {"sh", "js", "ts"} <= languages, languages
    assert len(SNIPPETS) >= 30, [s.where for s in SNIPPETS]


def test_every_block_is_run_or_says_why_not() -> None:
    for snippet in SNIPPETS:
        if snippet.kind is None:
            assert snippet.language in SHELL, \
                f"{snippet.where}: a {snippet.language} block needs a marker saying how " \
                "it runs (node, browser) or why it cannot (skip)"
            continue
        assert snippet.kind in KINDS, f"{snippet.where}: unknown marker {snippet.kind!r}"
        assert snippet.kind != "skip" or len(snippet.reason) >= 20, \
            f"{snippet.where}: a skipped block says why, and what runs it instead"
        assert snippet.kind != "browser" or snippet.reason, \
            f"{snippet.where}: `snippet: browser (EXPR)` needs the expression to wait for"
        if snippet.kind in ("server", "ci"):
            assert snippet.language in SHELL, f"{snippet.where}: {snippet.kind} is for sh"
        if snippet.kind in ("node", "browser"):
            assert snippet.language not in SHELL, f"{snippet.where}: {snippet.kind} is for JS"


def _commands(code: str) -> list[str]:
    """The block's command lines, without comments or blank lines."""
    lines = []
    for line in code.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


def _run(snippet: Snippet, args: list[str], cwd: Path, env: dict[str, str]) -> None:
    try:
        proc = subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout(RUN_TIMEOUT))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(failure(snippet, f"did not finish within {RUN_TIMEOUT:.0f} s",
                            _text(exc.stdout), _text(exc.stderr)))
    if proc.returncode != 0:
        pytest.fail(failure(snippet, f"exited {proc.returncode}", proc.stdout, proc.stderr))


@pytest.fixture(scope="module")
def built_client() -> Path:
    """clients/js compiled, for blocks that import protoflask-client."""
    return built_js_client()


def run_node(snippet: Snippet, env: dict[str, str], client: Path, tmp_path: Path) -> None:
    modules = tmp_path / "node_modules"
    modules.mkdir()
    (modules / "protoflask-client").symlink_to(client)
    (modules / "ws").symlink_to(client / "node_modules" / "ws")
    script = tmp_path / "snippet.mjs"
    script.write_text(snippet.code, encoding="utf-8")
    _run(snippet, [shutil.which("node") or "node", str(script)], tmp_path, env)


def run_browser(snippet: Snippet, server: ProtoServer) -> None:
    from ..integration.test_browser import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    from playwright.sync_api import sync_playwright

    body = (f"{snippet.code}\nfor (let i = 0; i < 500; i += 1) {{\n"
            f"  if ({snippet.reason}) return true;\n"
            "  await new Promise((r) => setTimeout(r, 20));\n}\nreturn false;")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = chromium.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{server.port}/health")
            try:
                done = page.evaluate(f"async (token) => {{\n{body}\n}}",
                                     server.issue_token("snippets"))
            except Exception as exc:  # noqa: BLE001 - the page's error, shown with the block
                pytest.fail(failure(snippet, f"threw in Chromium: {exc}"))
            assert done, failure(snippet, f"never reached `{snippet.reason}` in Chromium",
                                 err="\n".join(errors))
        finally:
            chromium.close()


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_block_runs(snippet: Snippet, live: ProtoServer, tmp_path: Path,
                    request: pytest.FixtureRequest) -> None:
    if snippet.kind == "skip":
        pytest.skip(f"{snippet.where}: {snippet.reason}")
    port = free_port()
    env = snippet_env(live, port)
    if snippet.kind == "ci":
        ci_lines = {line.strip() for line in CI.read_text().splitlines()}
        for command in _commands(snippet.code):
            assert command in ci_lines, \
                failure(snippet, f"has `{command}`, which .ci/run does not run")
    elif snippet.kind == "server":
        run_server(snippet, tmp_path / "unused", env, port, tmp_path,
                   command=["bash", "-c", snippet.code], cwd=ROOT, own_secret=True)
    elif snippet.kind == "node":
        run_node(snippet, env, request.getfixturevalue("built_client"), tmp_path)
    elif snippet.kind == "browser":
        run_browser(snippet, live)
    else:
        _run(snippet, ["bash", "-e", "-o", "pipefail", "-c", snippet.code], ROOT, env)


def test_ci_lines_are_checked() -> None:
    """A `ci` block whose line CI does not run fails (the check is not vacuous)."""
    assert "npm test" in CI.read_text()
    assert "rm -rf /" not in {line.strip() for line in CI.read_text().splitlines()}
    assert _commands("cd x   # go\n# only a comment\n\nmake all\n") == ["cd x", "make all"]
