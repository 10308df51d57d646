"""MCP Tasks (revision 2025-11-25, experimental there) for tools/call, kept nowhere but in
the protoflask session itself.

A task is a TOOL_CALL whose call_id is ``mcp-task:<taskId>``; the task id carries its
creation time. While the call is open in the session the task is ``working``; its
TOOL_DONE, which the session keeps in its replay window like every message it sends,
is the terminal status and the result (OK -> completed, ERROR -> failed, CANCELLED ->
cancelled). So a task lives as long as its result stays in the replay window
(replayWindowTime, the ``ttl`` announced), survives the request that started it, and
in a cluster is read on whichever node takes the session, including after the node that
ran it stopped (the window is shared through Redis).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator

import orjson

if TYPE_CHECKING:
    from ..port import SessionPort

PREFIX = "mcp-task:"
#: How often a client is asked to poll tasks/get
POLL_INTERVAL_MS = 500
RELATED_TASK = "io.modelcontextprotocol/related-task"
_STATUSES = {"OK": "completed", "ERROR": "failed", "CANCELLED": "cancelled"}
TERMINAL = frozenset(_STATUSES.values())


def new_task_id(now_ms: int) -> str:
    return f"{now_ms:x}-{uuid.uuid4().hex}"


def call_id(task_id: str) -> str:
    return PREFIX + task_id


def created_ms(task_id: str) -> int | None:
    head, sep, _ = task_id.partition("-")
    try:
        return int(head, 16) if sep else None
    except ValueError:
        return None


@dataclass(frozen=True)
class TaskState:
    task_id: str
    status: str
    created: int
    updated: int
    #: the TOOL_DONE payload once terminal
    done: dict[str, Any] | None = None

    def view(self, ttl_ms: int) -> dict[str, Any]:
        out: dict[str, Any] = {"taskId": self.task_id, "status": self.status,
                               "createdAt": iso(self.created),
                               "lastUpdatedAt": iso(self.updated), "ttl": ttl_ms,
                               "pollInterval": POLL_INTERVAL_MS}
        error = (self.done or {}).get("error")
        if error:
            out["statusMessage"] = f"{error.get('code')}: {error.get('message')}"
        return out


def iso(ms: int) -> str:
    """A time in ms since the epoch as MCP writes it: ISO 8601, UTC, milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _dones(port: "SessionPort", only: str | None = None) -> Iterator[tuple[dict[str, Any],
                                                                             int]]:
    """(TOOL_DONE payload, its ts) for the tasks' calls in the replay window."""
    needle = (only or PREFIX).encode()
    for stored in port.replay_window:
        if needle not in stored.data:  # most messages are not about a task
            continue
        message = orjson.loads(stored.data)
        payload = message.get("payload") or {}
        cid = payload.get("call_id")
        if message.get("type") == "TOOL_DONE" and isinstance(cid, str) and \
                cid.startswith(PREFIX) and (only is None or cid == only):
            yield payload, int(message.get("ts") or stored.stored_at)


def state(port: "SessionPort", task_id: str) -> TaskState | None:
    """The task's state in the session, or None when the session knows no such task."""
    created = created_ms(task_id)
    if created is None:
        return None
    cid = call_id(task_id)
    for payload, ts in _dones(port, cid):
        return TaskState(task_id, _STATUSES.get(payload.get("status", ""), "failed"),
                         created, ts, payload)
    if cid in port.open_calls:
        return TaskState(task_id, "working", created, created)
    return None


def all_states(port: "SessionPort") -> list[TaskState]:
    """Every task the session knows: working ones, then finished ones still in the window."""
    out = [TaskState(cid[len(PREFIX):], "working", created_ms(cid[len(PREFIX):]) or 0,
                     created_ms(cid[len(PREFIX):]) or 0)
           for cid in list(port.open_calls) if cid.startswith(PREFIX)]
    for payload, ts in _dones(port):
        task_id = payload["call_id"][len(PREFIX):]
        created = created_ms(task_id)
        if created is not None:
            out.append(TaskState(task_id, _STATUSES.get(payload.get("status", ""), "failed"),
                                 created, ts, payload))
    return out
