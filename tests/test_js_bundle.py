"""The browser bundle the dashboard ships (protoflask/static/protoclient.mjs) is the
build of clients/js, committed so pip users need no Node: rebuilt here with the pinned
esbuild, it must come out byte for byte the same, so it cannot drift from the source."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .support import ROOT

CLIENT = ROOT / "clients" / "js"
BUNDLE = ROOT / "protoflask" / "static" / "protoclient.mjs"


def test_the_committed_bundle_is_a_fresh_build(tmp_path):
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("node/npm is not installed")
    if not (CLIENT / "node_modules" / ".bin" / "esbuild").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True,
                       capture_output=True, timeout=300)
    fresh = tmp_path / "protoclient.mjs"
    subprocess.run([npm, "run", "bundle", "--", f"--outfile={fresh}"], cwd=CLIENT,
                   check=True, capture_output=True, timeout=120)
    assert fresh.read_bytes() == BUNDLE.read_bytes(), (
        "protoflask/static/protoclient.mjs is stale: run `npm run build` in clients/js "
        "and commit the result")
