"""The message the cluster tests send across nodes: a NOTE numbered ``n``."""

from __future__ import annotations

from typing import Any


def note(n: int) -> dict[str, Any]:
    return {"type": "NOTE", "channel": "AGENT", "payload": {"n": n}}
