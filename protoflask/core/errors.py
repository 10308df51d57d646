"""Every protocol error, each carrying its wire code and HTTP status.

Any layer can turn one of these into an ``ERROR`` message (``messages.error``)
or an HTTP error body without a lookup table elsewhere::

    ProtoError                      code               HTTP
    ├── InvalidMessage              INVALID_MESSAGE    400
    │   └── MissingRunId            MISSING_RUN_ID     400
    ├── UnsupportedType             UNSUPPORTED_TYPE   400
    ├── UnsupportedVersion          UNSUPPORTED_VERSION 400
    ├── HandshakeRequired           HANDSHAKE_REQUIRED 400
    ├── MessageTooLarge             MESSAGE_TOO_LARGE  413
    ├── ToolNotFound                TOOL_NOT_FOUND     404
    ├── ToolExecutionError          TOOL_EXECUTION_ERROR 500
    ├── DuplicateCallId             DUPLICATE_CALL_ID  409
    ├── InsufficientCredits         INSUFFICIENT_CREDITS 429
    ├── ChannelPaused               CHANNEL_PAUSED     429
    ├── RunNotFound                 RUN_NOT_FOUND      404
    ├── MaxRunsExceeded             MAX_RUNS_EXCEEDED  429
    ├── ReplayUnavailable           REPLAY_UNAVAILABLE 410
    ├── SessionNotFound             SESSION_NOT_FOUND  404
    ├── MissingToken                MISSING_TOKEN      401
    ├── InvalidToken                INVALID_TOKEN      401
    ├── MaxConnections              MAX_CONNECTIONS    503
    ├── RateLimited                 RATE_LIMITED       429
    ├── OriginNotAllowed            ORIGIN_NOT_ALLOWED 403
    ├── OutboundQueueFull           OUTBOUND_QUEUE_FULL (application side only)
    ├── ClusterUnavailable          CLUSTER_UNAVAILABLE 503
    └── ShuttingDown                SHUTTING_DOWN      503

``CloseCode`` is the other half of reporting a failure: the WebSocket close code a
transport ends a connection with (SSE and HTTP streaming carry it in their close event).
"""

from __future__ import annotations

import enum
from typing import Any


class CloseCode(enum.IntEnum):
    """Close codes the server uses (docs/PROTOCOL.md §6 Errors)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # the server stops, or the application closed the session
    POLICY_VIOLATION = 1008  # kept flooding past the rate limit
    TOO_LARGE = 1009
    HEARTBEAT = 4000  # no PONG within heartbeatTimeout
    UNSUPPORTED_VERSION = 4001
    SUPERSEDED = 4002  # the session was resumed on another connection or node
    SLOW_CONSUMER = 4003  # the client does not read: its outbound buffer is full
    MOVED = 4004  # a cluster node lost the session to another node: resume it there


class ProtoError(Exception):
    """Root of every error the protocol reports to a client."""

    code = "INTERNAL_ERROR"
    http_status = 500
    default_message = "internal error"

    def __init__(
        self,
        message: str | None = None,
        *,
        detail: Any = None,
        related_id: str | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.detail = detail
        self.related_id = related_id
        super().__init__(self.message)

    def to_payload(self) -> dict[str, Any]:
        """The ERROR message payload (docs/PROTOCOL.md §6 Errors)."""
        payload: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.related_id is not None:
            payload["related_id"] = self.related_id
        if self.detail is not None:
            payload["detail"] = self.detail
        return payload

    def to_http_body(self) -> dict[str, Any]:
        """The JSON body of an HTTP error response (docs/PROTOCOL.md §11)."""
        return {"error": {"code": self.code, "message": self.message}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}: {self.message!r})"


class InvalidMessage(ProtoError):
    code, http_status, default_message = "INVALID_MESSAGE", 400, "invalid message"


class MissingRunId(InvalidMessage):
    code, default_message = "MISSING_RUN_ID", "run_id is required"


class UnsupportedType(ProtoError):
    code, http_status, default_message = "UNSUPPORTED_TYPE", 400, "unsupported message type"


class UnsupportedVersion(ProtoError):
    code, http_status, default_message = "UNSUPPORTED_VERSION", 400, "no supported major version"


class HandshakeRequired(ProtoError):
    code, http_status, default_message = (
        "HANDSHAKE_REQUIRED", 400, "send HELLO before other messages")


class MessageTooLarge(ProtoError):
    code, http_status, default_message = "MESSAGE_TOO_LARGE", 413, "message too large"


class ToolNotFound(ProtoError):
    code, http_status, default_message = "TOOL_NOT_FOUND", 404, "tool not found"


class ToolExecutionError(ProtoError):
    code, http_status, default_message = "TOOL_EXECUTION_ERROR", 500, "tool execution failed"


class DuplicateCallId(ProtoError):
    code, http_status, default_message = "DUPLICATE_CALL_ID", 409, "call_id is already running"


class InsufficientCredits(ProtoError):
    code, http_status, default_message = (
        "INSUFFICIENT_CREDITS", 429, "not enough credits for the channel")


class ChannelPaused(ProtoError):
    code, http_status, default_message = "CHANNEL_PAUSED", 429, "the channel is paused"


class RunNotFound(ProtoError):
    code, http_status, default_message = "RUN_NOT_FOUND", 404, "run not found"


class MaxRunsExceeded(ProtoError):
    code, http_status, default_message = (
        "MAX_RUNS_EXCEEDED", 429, "maximum number of concurrent runs exceeded")


class ReplayUnavailable(ProtoError):
    code, http_status, default_message = (
        "REPLAY_UNAVAILABLE", 410, "requested messages are no longer in the replay window")


class SessionNotFound(ProtoError):
    code, http_status, default_message = "SESSION_NOT_FOUND", 404, "session not found"


class MissingToken(ProtoError):
    code, http_status, default_message = "MISSING_TOKEN", 401, "a token is required"


class InvalidToken(ProtoError):
    code, http_status, default_message = "INVALID_TOKEN", 401, "invalid or expired token"


class MaxConnections(ProtoError):
    code, http_status, default_message = "MAX_CONNECTIONS", 503, "too many connections"


class UserConnectionLimit(ProtoError):
    """One user holds maxConnectionsPerUser live transports (or POST bodies) already."""

    code, http_status, default_message = (
        "USER_CONNECTION_LIMIT", 503, "too many connections for this user")


class RequestTimeout(ProtoError):
    """A request body did not arrive within bodyTimeout."""

    code, http_status, default_message = (
        "REQUEST_TIMEOUT", 408, "the request body did not arrive in time")


class RateLimited(ProtoError):
    code, http_status, default_message = (
        "RATE_LIMITED", 429, "too many messages; this one was dropped")


class OriginNotAllowed(ProtoError):
    code, http_status, default_message = (
        "ORIGIN_NOT_ALLOWED", 403, "the request's Origin is not in allowedOrigins")


class OutboundQueueFull(ProtoError):
    """Never sent to a client: reported to the application (``error`` signal, log) when a
    message for a session was dropped because its pending queue was full."""

    code, http_status, default_message = (
        "OUTBOUND_QUEUE_FULL", 503, "the session's pending queue is full; message dropped")


class ClusterUnavailable(ProtoError):
    """With redisUrl set: what needs Redis (a session held by another node, a broadcast
    beyond this node) while Redis is unreachable. Local sessions keep working."""

    code, http_status, default_message = (
        "CLUSTER_UNAVAILABLE", 503, "the cluster's Redis is unreachable")
    #: seconds for a Retry-After header (None: none)
    retry_after: int | None = None


class ShuttingDown(ProtoError):
    code, http_status, default_message = "SHUTTING_DOWN", 503, "server is shutting down"


class ToolCancelled(Exception):
    """A tool call ended cancelled (TOOL_CANCEL, RUN_CANCEL, or its session went away).
    Not a ProtoError (no ERROR carries it): the one root of ``protoflask.ToolCancelled``
    (this class, raised by ``ProtoServer.call_tool``) and ``protoflask.client.ToolCancelled``."""


def _all_subclasses(cls: type[ProtoError]) -> list[type[ProtoError]]:
    out: list[type[ProtoError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


#: code -> exception class, for clients and tests that turn codes back into types.
ERRORS_BY_CODE: dict[str, type[ProtoError]] = {
    c.code: c for c in _all_subclasses(ProtoError)
}
