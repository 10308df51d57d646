"""A Python client for protoflask servers, over WebSocket, SSE or the HTTP stream.

    from protoflask.client import connect
    with connect("http://127.0.0.1:8080", token, transport="ws") as client:
        client.send_text("hello")
        print(client.next_text(timeout=5).text)
        print(client.call_tool("add", {"a": 2, "b": 40}))     # {"result": 42}

Works from plain threads and under gevent (after ``gevent.monkey.patch_all()``), keeps
the session across dropped connections (resume, resend, no duplicates), answers
heartbeats and honours credits on its own. See docs/CLIENT.md.
"""

from ._client import Client, Text, ToolCall, connect
from .errors import (
    ClientTimeout, ConnectionFailed, ConnectionLost, ConnectionRefused, ProtoClientError,
    RunError, ServerError, ToolCancelled, ToolError,
)

__all__ = [
    "Client", "ClientTimeout", "ConnectionFailed", "ConnectionLost", "ConnectionRefused",
    "ProtoClientError", "RunError", "ServerError", "Text", "ToolCall", "ToolCancelled",
    "ToolError", "connect",
]
