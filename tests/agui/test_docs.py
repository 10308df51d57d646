"""docs/AGUI.md's HttpAgent example runs as written (Node, the published client) against
a live server whose built-in echo answers it."""

from __future__ import annotations

import os
import re
import subprocess

from ..interop.conftest import QUIET
from ..support import ROOT, timeout
from .conftest import NODE_DIR, need_agui_node

JS_BLOCK = re.compile(r"^```js\n(.*?)^```", re.S | re.M)


def test_the_httpagent_example_of_agui_md_runs(make_server, tmp_path):
    blocks = JS_BLOCK.findall((ROOT / "docs" / "AGUI.md").read_text())
    assert len(blocks) == 1, "docs/AGUI.md has one HttpAgent example"
    node = need_agui_node()
    server = make_server(**QUIET)
    # next to node_modules, so that "@ag-ui/client" resolves as it does in an app
    script = NODE_DIR / f".docs-example-{os.getpid()}.mjs"
    script.write_text(blocks[0])
    try:
        proc = subprocess.run(
            [node, script.name], cwd=NODE_DIR, capture_output=True, text=True,
            timeout=timeout(60), env={**os.environ, "PROTOFLASK_URL": server.base_url,
                                      "PROTOFLASK_TOKEN": server.issue_token("docs"),
                                      "SUPPRESS_TRANSFORMATION_WARNINGS": "1"})
    finally:
        script.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["hello", "hello"], proc.stdout
