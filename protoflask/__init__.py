"""protoflask: a real-time agent protocol server on Flask + gevent.

    from protoflask import ProtoServer, Tool
    server = ProtoServer({"jwtSecret": "...", "port": 0})
    server.start(); print(server.port); server.stop()

Names are imported lazily, so ``protoflask serve`` can monkey-patch gevent before
anything imports sockets, ssl or threading.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": ".config",
    "FlowControlConfig": ".config",
    "ServerConfig": ".config",
    "ProtoError": ".core.errors",
    "Run": ".core.session",
    "ProtoServer": ".server",
    "StreamedText": ".streaming",
    "create_app": ".server",
    "Tool": ".tools",
    "ToolBlueprint": ".blueprints",
    "ToolCancelled": ".tools",
    "ToolExecution": ".tools",
}
_MODULES = {"messages": ".core.messages", "signals": ".signals", "errors": ".core.errors"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name], __name__)
    raise AttributeError(f"module 'protoflask' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
