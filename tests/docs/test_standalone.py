"""The repository stands alone: nothing in it points at documents that are not in it,
and every file the docs name exists.

The protocol's reference is docs/PROTOCOL.md and the performance notes are
docs/PERFORMANCE.md. Files this project once cited from outside the repository (a
specification, a contract, performance notes, a benchmark script that no longer exists)
must not be cited by any tracked file: a newcomer on a fresh clone cannot open them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: Citations of documents outside the repository. Case-sensitive: "the spec" in prose is
#: fine, "SPEC 2.6" and "CONTRACT 5" are section numbers of documents a reader lacks.
FORBIDDEN = re.compile(
    r"SPEC\.md|CONTRACT\.md|PERF-NOTES|\.\./shared/|/work/shared|bench/ping\.py"
    r"|\b(?:SPEC|CONTRACT)(?:'s\b|\s+\d)"
)

#: Paths a doc may name that exist only once something has run (git-ignored output).
GENERATED = {"bench/results"}

#: A repository path in running text: one of the top-level folders, then path characters.
#: Not preceded by a path character, so ``~/.cache/protoflask/x`` or a URL is not one.
DOC_PATH = re.compile(r"(?<![\w./~@:-])((?:protoflask|bench|tests|examples|docs|\.ci)/[\w./-]*)")
#: A relative Markdown link target: [text](target) or [text](target#anchor).
DOC_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def tracked_files() -> list[str]:
    """Every file under version control (or, outside a git checkout, every file that is
    not a virtual environment, cache or dependency folder)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "results",
            ".hypothesis"}
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
        for name in filenames:
            files.append((Path(dirpath) / name).relative_to(ROOT).as_posix())
    return files


def read_text(path: str) -> str | None:
    data = (ROOT / path).read_bytes() if (ROOT / path).is_file() else b""
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def citations(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if FORBIDDEN.search(line)]


def test_no_file_cites_documents_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if path == THIS:
            continue
        text = read_text(path)
        if text is None:
            continue
        found += [f"{path}:{n}: {line[:120]}" for n, line in citations(text)]
    assert not found, ("cite docs/PROTOCOL.md (with a section name) or docs/PERFORMANCE.md "
                       "instead:\n" + "\n".join(found))


def named_paths(doc: Path, text: str) -> set[str]:
    """Repository paths a document names: in running text (relative to the root) and as
    relative Markdown links (relative to the document)."""
    names = set()
    for match in DOC_PATH.finditer(text):
        names.add(match.group(1).rstrip("."))
    for match in DOC_LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # a URL, or a path on a server
        resolved = os.path.normpath(doc.parent.relative_to(ROOT) / target)
        names.add(Path(resolved).as_posix())
    return names


def missing(doc: Path) -> list[str]:
    gone = []
    for name in sorted(named_paths(doc, doc.read_text(encoding="utf-8"))):
        bare = name.rstrip("/")
        if bare in GENERATED or any(bare.startswith(g + "/") for g in GENERATED):
            continue
        if not (ROOT / bare).exists():
            gone.append(name)
    return gone


DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    assert not missing(doc), f"{doc.name} names paths that do not exist: {missing(doc)}"


#: "PROTOCOL.md §5", "docs/PROTOCOL-http.md §3", "PROTOCOL.md §5.1 Upstream credit".
SECTION_CITE = re.compile(r"(PROTOCOL(?:-http)?\.md),? §(\d+(?:\.\d+)?)")
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)


def sections(doc: str) -> set[str]:
    return set(HEADING.findall((ROOT / "docs" / doc).read_text(encoding="utf-8")))


def test_every_cited_protocol_section_exists() -> None:
    """Code and docs cite "docs/PROTOCOL.md §N": each such section must be a heading."""
    known = {doc: sections(doc) for doc in ("PROTOCOL.md", "PROTOCOL-http.md")}
    dangling = []
    for path in tracked_files():
        text = read_text(path)
        if text is None or path == THIS:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for doc, number in SECTION_CITE.findall(line):
                if number not in known[doc]:
                    dangling.append(f"{path}:{n}: {doc} §{number}")
    assert not dangling, "cited sections that do not exist:\n" + "\n".join(dangling)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The patterns catch what they are meant to, and leave prose and names alone."""
    assert citations("see SPEC.md\n") and citations("(CONTRACT 5)\n")
    assert citations("SPEC 2.6's fields") and citations("in ../shared/CONTRACT.md")
    assert citations("like bench/ping.py") and citations("(PERF-NOTES)")
    assert not citations("the spec's event names; CONTRACT_SERVER_TYPES = {}")
    doc = ROOT / "docs" / "PROTOCOL.md"
    text = ("`protoflask/core/nope.py`, [x](NOPE.md), ~/.cache/protoflask/t.json, "
            "`bench/results/<t>.json`, http://h/docs/x")
    names = named_paths(doc, text)
    assert {"protoflask/core/nope.py", "docs/NOPE.md", "bench/results/"} == names
    assert SECTION_CITE.findall("(docs/PROTOCOL.md §5.3) PROTOCOL-http.md §4") == [
        ("PROTOCOL.md", "5.3"), ("PROTOCOL-http.md", "4")]
    assert "5.1" in sections("PROTOCOL.md") and "99" not in sections("PROTOCOL.md")
