"""The Model Context Protocol's JSON-RPC wire as far as protoflask serves it: the
revisions it negotiates, its error codes, and how protoflask's tools, TOOL_UPDATEs and
TOOL_DONEs read as MCP (docs/MCP.md). Plain data in, plain data out: no I/O here.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

#: The initialize-handshake revisions served, oldest to newest (docs/MCP.md). The
#: stateless 2026-07-28 revision (``server/discover``) is not served: a client that probes
#: it gets METHOD_NOT_FOUND and falls back to ``initialize``, as both official SDKs do.
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST = VERSIONS[-1]
#: What a request without an MCP-Protocol-Version header is taken to speak (the
#: transport specification's rule for 2025-06-18 and later).
DEFAULT_VERSION = "2025-03-26"
#: From this revision on a tool has ``outputSchema`` and a result ``structuredContent``.
STRUCTURED_SINCE = "2025-06-18"
#: From this revision on a tools/call may run as a task (tasks/get, tasks/result...)
TASKS_SINCE = "2025-11-25"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: The SDKs' code for a request the server no longer serves (its session is gone)
CONNECTION_CLOSED = -32000

SERVER_INFO = {"name": "protoflask", "version": "1.1.2"}


class RpcError(Exception):
    """A JSON-RPC error to answer a request with."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def negotiate(requested: Any) -> str:
    """The revision to answer an ``initialize`` with: the client's own when served, else
    the newest (the client then decides whether it can speak it)."""
    return requested if requested in VERSIONS else LATEST


def at_least(version: str, minimum: str) -> bool:
    return VERSIONS.index(version) >= VERSIONS.index(minimum) if version in VERSIONS else False


def parse_message(body: bytes) -> dict[str, Any]:
    """One JSON-RPC message (request, notification or response) from a POST body."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RpcError(PARSE_ERROR, "the body is not JSON") from None
    if isinstance(message, list):
        raise RpcError(INVALID_REQUEST, "JSON-RPC batches are not served (removed in 2025-06-18)")
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 message")
    if "method" in message and not isinstance(message["method"], str):
        raise RpcError(INVALID_REQUEST, "method must be a string")
    if "id" in message and (isinstance(message["id"], bool)
                            or not isinstance(message["id"], (str, int))):
        raise RpcError(INVALID_REQUEST, "id must be a string or an integer")
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    return message


def result(request_id: Any, body: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": body}


def error(request_id: Any, exc: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": exc.to_dict()}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        out["params"] = params
    return out


def initialize_result(version: str) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
    if at_least(version, TASKS_SINCE):
        capabilities["tasks"] = {"list": {}, "cancel": {},
                                 "requests": {"tools": {"call": {}}}}
    return {"protocolVersion": version, "capabilities": capabilities,
            "serverInfo": SERVER_INFO,
            "instructions": "protoflask tools (docs/MCP.md)"}


# -- tools ----------------------------------------------------------------------------------


def tool_listing(tools: Iterable[dict[str, Any]], version: str) -> dict[str, Any]:
    """tools/list's result from the registry's wire views (name, description,
    inputSchema, outputSchema). MCP requires both schemas to describe objects: an input
    schema without a type is published as an object's; an output schema that is not an
    object's is left out (the text content still carries the result)."""
    structured = at_least(version, STRUCTURED_SINCE)
    tasks = at_least(version, TASKS_SINCE)
    listed = []
    for tool in tools:
        entry = {"name": tool["name"], "description": tool["description"],
                 "inputSchema": _object_schema(tool["inputSchema"])}
        output = tool.get("outputSchema")
        if structured and isinstance(output, dict) and output.get("type") == "object":
            entry["outputSchema"] = output
        if tasks:  # any call may run as a task, or not
            entry["execution"] = {"taskSupport": "optional"}
        listed.append(entry)
    return {"tools": listed}


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return schema if schema.get("type") == "object" else {**schema, "type": "object"}


def call_result(done: dict[str, Any], version: str) -> dict[str, Any]:
    """A TOOL_DONE payload as a tools/call result: the result as text content plus, from
    2025-06-18, as ``structuredContent`` when it is an object; ERROR and CANCELLED as a
    tool error (``isError``) whose text names the contract's code."""
    status = done.get("status")
    if status == "OK":
        value = done.get("result")
        out: dict[str, Any] = {"content": [{"type": "text", "text": _text(value)}],
                               "isError": False}
        if isinstance(value, dict) and at_least(version, STRUCTURED_SINCE):
            out["structuredContent"] = value
        return out
    err = done.get("error") or {"code": "CANCELLED" if status == "CANCELLED" else "ERROR",
                                "message": "the call was cancelled" if status == "CANCELLED"
                                else "the tool failed"}
    text = f"{err.get('code')}: {err.get('message')}"
    if err.get("detail") is not None:
        text += "\n" + _text(err["detail"])
    return {"content": [{"type": "text", "text": text}], "isError": True}


def refused_result(error_payload: dict[str, Any]) -> dict[str, Any]:
    """A call the session refused before running it (an ERROR with no TOOL_DONE: a
    duplicate id, no credit, a paused channel) as a tool error."""
    return call_result({"status": "ERROR", "error": error_payload}, LATEST)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def progress(token: Any, update: dict[str, Any], last: float) -> tuple[dict[str, Any] | None,
                                                                      float]:
    """A TOOL_UPDATE as ``notifications/progress`` (progress out of 100, the partial as
    the message), and the progress now reported. MCP's progress must rise: an update
    whose progress does not and that carries no partial is not worth a notification
    (None)."""
    value = update.get("progress")
    partial = update.get("partial")
    now = max(last, float(value)) if isinstance(value, (int, float)) else last
    if now <= last and partial is None:
        return None, last
    params: dict[str, Any] = {"progressToken": token, "progress": now, "total": 100}
    if partial is not None:
        params["message"] = _text(partial)
    return notification("notifications/progress", params), now
