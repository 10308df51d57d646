"""Every Python snippet of README.md and docs/*.md runs as written.

Each ```python block is saved to a file of its own and run with this interpreter in a
subprocess, against a live protoflask server, with the environment the docs tell a reader
to set:

    PROTOFLASK_URL    the live server's base URL (snippets default to 127.0.0.1:8080)
    PROTOFLASK_TOKEN  a valid token for that server (what `serve --dev` prints)
    JWT_SECRET        a secret, for snippets that build their own ProtoServer
    PORT, HOST        a free port on 127.0.0.1, for snippets that start a server

A block may be marked by an HTML comment on the line before its fence (the comment is
invisible on GitHub):

    <!-- snippet: skip (why it cannot run) -->     not run; the reason is required and
                                                   is shown as the skip reason
    <!-- snippet: server (what it serves) -->      starts a server that does not return:
                                                   it must answer /health on $PORT, take
                                                   a ping over WebSocket with a token
                                                   signed by $JWT_SECRET, and stop on
                                                   SIGTERM

Any other block must exit 0 within the timeout. A new snippet is picked up without
changing this file; when one fails, the message names the file and line and shows its
output.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import requests

from protoflask import ProtoServer
from protoflask.auth import TokenAuthority

from ..support import ROOT, SECRET, free_listener, timeout, wait_for

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```(python|py|python3)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*(\w+)\s*(?:\((.*)\))?\s*-->\s*$")
KINDS = ("skip", "server")
RUN_TIMEOUT = 60.0

#: Snippets in files another branch is rewriting, by the sha256 of their code: skipped
#: with the reason given, until that file's new version lands (a changed snippet no longer
#: matches and is run; an entry that matches nothing fails test_pending_entries_are_live,
#: so the list cannot rot).
PENDING: dict[str, str] = {}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    language: str  # as the fence names it
    kind: str | None  # None: run it; "skip" / "server" / anything else (an error)
    reason: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:8]


def extract(path: Path, fences: re.Pattern[str] = FENCE) -> Iterator[Snippet]:
    """The blocks of ``path`` whose opening fence matches ``fences`` (group 1: the indent,
    group 2: the language)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    n = 0
    while n < len(lines):
        fence = fences.match(lines[n])
        if fence:  # also indented, in a list item
            start, indent = n, fence.group(1)
            before = next((lines[k] for k in range(n - 1, -1, -1) if lines[k].strip()), "")
            marker = MARKER.match(before.strip())
            body: list[str] = []
            n += 1
            while n < len(lines) and not lines[n].strip().startswith("```"):
                body.append(lines[n][len(indent):] if lines[n].startswith(indent) else lines[n])
                n += 1
            code = textwrap.dedent("\n".join(body)) + "\n"
            yield Snippet(path, start + 1, code, fence.group(2),
                          marker.group(1) if marker else None,
                          (marker.group(2) or "").strip() if marker else "")
        n += 1


SNIPPETS = [snippet for doc in DOCS for snippet in extract(doc)]


@pytest.fixture(scope="module")
def live() -> Iterator[ProtoServer]:
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def snippet_env(server: ProtoServer, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PROTOFLASK_", "REDIS_")) and k not in ("HOST", "PORT")}
    env.update({
        "PROTOFLASK_URL": f"http://127.0.0.1:{server.port}",
        "PROTOFLASK_TOKEN": server.issue_token("snippets"),
        "PROTOFLASK_DEV_TOKEN_FILE": os.devnull + ".absent",
        "JWT_SECRET": SECRET,
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def free_port() -> int:
    listener = free_listener()
    port = listener.getsockname()[1]
    listener.close()
    return port


def failure(snippet: Snippet, what: str, out: str, err: str) -> str:
    return (f"the Python snippet at {snippet.where} {what}.\n"
            f"It must run as written with PROTOFLASK_URL / PROTOFLASK_TOKEN / JWT_SECRET / "
            f"PORT set (see tests/docs/test_snippets.py); mark it "
            f"`<!-- snippet: skip (reason) -->` or `<!-- snippet: server (...) -->` on the "
            f"line before its fence if it cannot.\n--- code ---\n{snippet.code}"
            f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")


def test_the_docs_have_snippets() -> None:
    """The extractor finds the README's snippets (a broken extractor must not pass by
    finding nothing)."""
    readme = [s for s in SNIPPETS if s.path.name == "README.md"]
    assert len(readme) >= 4, [s.where for s in SNIPPETS]


def test_every_marker_is_known_and_every_skip_justified() -> None:
    skipped = []
    for snippet in SNIPPETS:
        if snippet.kind is None:
            continue
        assert snippet.kind in KINDS, \
            f"{snippet.where}: unknown marker `snippet: {snippet.kind}` (known: {KINDS})"
        if snippet.kind == "skip":
            assert len(snippet.reason) >= 10, \
                f"{snippet.where}: a skipped snippet needs a reason: " \
                "`<!-- snippet: skip (why) -->`"
            skipped.append(snippet)
    ran = [s for s in SNIPPETS if s.kind != "skip" and s.digest not in PENDING]
    # Most snippets must run: skipping is for the few that cannot (a shell session, a
    # fragment of a larger file), not a way around a broken one.
    assert len(skipped) + len(PENDING) <= len(ran), \
        f"{len(skipped)} skipped vs {len(ran)} run: {[s.where for s in skipped]}"


def test_pending_entries_are_live() -> None:
    digests = {s.digest for s in SNIPPETS}
    stale = sorted(set(PENDING) - digests)
    assert not stale, f"PENDING entries match no snippet any more, remove them: {stale}"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, live: ProtoServer, tmp_path: Path) -> None:
    if snippet.kind == "skip":
        pytest.skip(f"{snippet.where}: {snippet.reason}")
    if snippet.digest in PENDING:
        pytest.skip(f"{snippet.where}: pending: {PENDING[snippet.digest]}")
    port = free_port()
    env = snippet_env(live, port)
    script = tmp_path / "app.py"
    script.write_text(snippet.code, encoding="utf-8")
    if snippet.kind == "server":
        run_server(snippet, script, env, port, tmp_path)
        return
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout(RUN_TIMEOUT))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(failure(snippet, f"did not finish within {RUN_TIMEOUT:.0f} s (if it "
                            "starts a server, mark it `snippet: server`)",
                            _text(exc.stdout), _text(exc.stderr)))
    if proc.returncode != 0:
        pytest.fail(failure(snippet, f"exited {proc.returncode}", proc.stdout, proc.stderr))


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def run_server(snippet: Snippet, script: Path, env: dict[str, str], port: int,
               tmp_path: Path, command: list[str] | None = None, cwd: Path | None = None,
               own_secret: bool = False) -> None:
    """Start the snippet (``command``, else the Python script), wait for /health on $PORT,
    ping it over WebSocket with a token signed by $JWT_SECRET (``own_secret``: the snippet
    makes its own secret, so a refused token is the protoflask answer to expect), then
    SIGTERM it (its whole process group)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(command or [sys.executable, str(script)], cwd=cwd or tmp_path,
                                env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(failure(snippet, f"exited {proc.returncode} instead of serving "
                                f"on $PORT", out.read_text(), err.read_text()))
        try:
            return requests.get(f"{base}/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        try:
            wait_for(healthy, within=30, what=f"{snippet.where} to answer {base}/health")
        except AssertionError:
            pytest.fail(failure(snippet, "never answered /health on $PORT", out.read_text(),
                                err.read_text()))
        from protoflask.client import ConnectionRefused, connect

        token = TokenAuthority(env["JWT_SECRET"]).issue("snippets")
        if own_secret:
            with pytest.raises(ConnectionRefused) as refused:
                connect(base, token, timeout=timeout(10))
            assert refused.value.code == "INVALID_TOKEN"
        else:
            with connect(base, token, timeout=timeout(10)) as client:
                assert isinstance(client.ping(timeout=timeout(10)), float)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout(20))
        except subprocess.TimeoutExpired:
            pytest.fail(failure(snippet, "did not stop on SIGTERM", out.read_text(),
                                err.read_text()))
        assert code in (0, -signal.SIGTERM), \
            failure(snippet, f"exited {code} on SIGTERM", out.read_text(), err.read_text())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_extract_reads_fences_markers_and_indented_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(textwrap.dedent("""\
        Intro.

        ```python
        print(1)
        ```

        <!-- snippet: skip (needs a GPU) -->

        ```py
        import torch
        ```

        - a list item:

          ```python
          if True:
              print(2)
          ```

        ```sh
        echo not python
        ```
        """), encoding="utf-8")
    found = list(extract(doc))
    assert [(s.line, s.kind, s.reason, s.code) for s in found] == [
        (3, None, "", "print(1)\n"),
        (9, "skip", "needs a GPU", "import torch\n"),
        (15, None, "", "if True:\n    print(2)\n"),
    ]
