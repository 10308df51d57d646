"""protoflask: a real-time agent protocol server on Flask + gevent.

    from protoflask import ProtoServer, Tool
    server = ProtoServer({"jwtSecret": "s", "port": 0})
    server.start(); print(server.port); server.stop()
"""

from . import signals
from .config import ConfigError, FlowControlConfig, ServerConfig
from .core import messages
from .core.errors import ProtoError
from .core.session import Run
from .server import ProtoServer, create_app
from .tools import Tool, ToolExecution

__all__ = [
    "ConfigError", "FlowControlConfig", "ProtoError", "ProtoServer", "Run", "ServerConfig",
    "Tool", "ToolExecution", "create_app", "messages", "signals",
]
__version__ = "0.1.0"
