"""The protocol core is sans-I/O: importing it pulls in no web framework, no gevent,
no sockets and none of the project's transport modules."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "protoflask" / "core"

PROBE = r"""
import json, sys
before = set(sys.modules)
import protoflask.core
import protoflask.core.session, protoflask.core.envelope, protoflask.core.credits
import protoflask.core.replay, protoflask.core.messages, protoflask.core.errors
print(json.dumps({"new": sorted(set(sys.modules) - before)}))
"""


def test_importing_the_core_loads_no_flask_gevent_or_transport_modules():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    loaded = report["new"]
    top = {name.split(".")[0] for name in loaded}
    for banned in ("flask", "gevent", "werkzeug", "flask_sock", "simple_websocket", "jwt",
                   "blinker", "gunicorn", "websockets"):
        assert banned not in top, f"importing protoflask.core loaded {banned}"
    project = [m for m in loaded if m == "protoflask" or m.startswith("protoflask.")]
    outside = [m for m in project if m != "protoflask" and not m.startswith("protoflask.core")]
    assert outside == [], f"protoflask.core pulled in project modules {outside}"
    # (The stdlib ``socket`` module may appear: marshmallow imports it. What matters is
    # that no project module that opens sockets, and no server library, is loaded.)


BANNED_IMPORTS = {"socket", "ssl", "select", "selectors", "asyncio", "threading", "time",
                  "datetime", "flask", "gevent", "werkzeug", "random", "uuid", "os"}


def test_core_sources_import_no_io_or_clock_modules():
    offenders = []
    for path in sorted(CORE.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names
                          if n.split(".")[0] in BANNED_IMPORTS]
    assert offenders == []
