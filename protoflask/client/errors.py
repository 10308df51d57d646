"""Errors the client raises; each carries the contract ``code`` the server reported.

::

    ProtoClientError            code, message, detail
    ├── ConnectionRefused       HTTP 401/404/503/...: status + the body's error code
    ├── ConnectionFailed        the server could not be reached (code UNREACHABLE)
    ├── ConnectionLost          the session is gone and cannot be resumed
    ├── ClientTimeout           no answer in time (code TIMEOUT); also a TimeoutError
    ├── ServerError             an in-protocol ERROR answering one of our messages
    ├── ToolError               TOOL_DONE with status ERROR (code from its ``error``)
    │   └── ToolCancelled       TOOL_DONE with status CANCELLED (code CANCELLED)
    └── RunError                RUN_FINISHED with status ``error``

The codes are the contract's (``INVALID_TOKEN``, ``TOOL_NOT_FOUND``,
``SESSION_NOT_FOUND``, ...); the few the client adds itself are ``UNREACHABLE``,
``TIMEOUT``, ``CANCELLED``, ``SUPERSEDED`` and ``CLOSED``.
"""

from __future__ import annotations

from typing import Any

from ..core import errors as core_errors


class ProtoClientError(Exception):
    """Root of every client error; ``code`` is the wire code (docs/PROTOCOL.md §6)."""

    def __init__(self, code: str, message: str = "", detail: Any = None) -> None:
        self.code = code
        self.message = message or code
        self.detail = detail
        super().__init__(f"{code}: {self.message}")


class ConnectionRefused(ProtoClientError):
    """The server answered the connection request (or an upstream POST) with an HTTP
    error; ``status`` is the HTTP status, ``code`` the JSON body's error code,
    ``retry_after`` the seconds its Retry-After header asked (a 503 to retry), if any."""

    def __init__(self, status: int, code: str, message: str = "",
                 retry_after: float | None = None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(code, message or f"HTTP {status}")

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.code}: {self.message}"


class ConnectionFailed(ProtoClientError):
    """No connection could be made (refused, unreachable, DNS, TLS, timeout)."""

    def __init__(self, message: str) -> None:
        super().__init__("UNREACHABLE", message)


class ConnectionLost(ProtoClientError):
    """The session ended and will not be resumed (closed, superseded, expired, or
    reconnecting gave up); ``code`` says why."""


class ClientTimeout(ProtoClientError, TimeoutError):
    def __init__(self, message: str) -> None:
        super().__init__("TIMEOUT", message)


class ServerError(ProtoClientError):
    """An ``ERROR`` message the server sent about one of our messages."""


class ToolError(ProtoClientError):
    """A tool call ended in ``TOOL_DONE`` ``ERROR`` (or was refused with ``ERROR``)."""

    def __init__(self, code: str, message: str = "", detail: Any = None,
                 call_id: str | None = None) -> None:
        self.call_id = call_id
        super().__init__(code, message, detail)


class ToolCancelled(ToolError, core_errors.ToolCancelled):
    """Also a ``core.errors.ToolCancelled``, the root the server's ToolCancelled shares."""

    def __init__(self, call_id: str | None = None) -> None:
        super().__init__("CANCELLED", "the tool call was cancelled", call_id=call_id)


class RunError(ProtoClientError):
    """A run ended with status ``error``."""
