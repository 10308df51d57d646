"""An AG-UI ``RunAgentInput``, checked, and the session that holds its thread.

Checked here is what the server relies on (docs/AGUI.md): ``threadId`` and ``runId``
non-empty strings, ``messages`` an array of objects with a string ``role``, ``tools`` and
``context`` arrays of objects when present, ``tools[].name`` a string. Everything else is
the application's, handed over as it came. A failure is the contract's 400
INVALID_MESSAGE, answered before any event.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..core.errors import InvalidMessage

#: the longest threadId / runId accepted (they name sessions and runs)
MAX_ID_LENGTH = 256


@dataclass(frozen=True)
class RunInput:
    """What a client asked an AG-UI run to do (RunAgentInput, snake_case)."""

    thread_id: str
    run_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)
    state: Any = None
    forwarded_props: Any = None
    parent_run_id: str | None = None

    def last_user_text(self) -> str | None:
        """The text of the last user message (its text parts joined), or None."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message_text(message.get("content"))
        return None


def parse_run_input(body: bytes) -> RunInput:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"RunAgentInput is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidMessage("RunAgentInput must be a JSON object")
    thread_id = _id(obj, "threadId")
    run_id = _id(obj, "runId")
    messages = _objects(obj, "messages", required=True)
    for i, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise InvalidMessage(f"messages[{i}].role must be a string")
    tools = _objects(obj, "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InvalidMessage(f"tools[{i}].name must be a non-empty string")
    parent = obj.get("parentRunId")
    if parent is not None and not isinstance(parent, str):
        raise InvalidMessage("parentRunId must be a string")
    return RunInput(thread_id, run_id, messages, tools, _objects(obj, "context"),
                    obj.get("state"), obj.get("forwardedProps"), parent)


def thread_session_id(user_id: str, thread_id: str) -> str:
    """The session that holds a user's AG-UI thread: the same on every worker of a
    cluster, and different for every user (another user's thread of the same name is
    another session)."""
    digest = hashlib.sha256(f"{user_id}\0{thread_id}".encode()).hexdigest()[:32]
    return f"agui-{digest}"


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _id(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidMessage(f"{name} is longer than {MAX_ID_LENGTH} characters")
    return value


def _objects(obj: dict[str, Any], name: str, required: bool = False) -> list[dict[str, Any]]:
    value = obj.get(name)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidMessage(f"{name} must be an array of objects")
    return value
