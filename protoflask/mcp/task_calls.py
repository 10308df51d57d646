"""The MCP Tasks methods on a session's link (docs/MCP.md "Tasks"): a task-augmented
tools/call, tasks/get, tasks/result, tasks/list and tasks/cancel. Each returns the
JSON-RPC message to answer with; what a task is lives in ``tasks.py``."""

from __future__ import annotations

from typing import Any, Callable

import gevent

from ..clock import now_ms
from . import tasks, wire
from .link import McpLink

#: How often a tasks/result that another request already waits on looks again
RECHECK_SECONDS = 0.1
#: tools/call's answer once the call ended: ``answer(request_id, kind, payload, version)``
Answer = Callable[[Any, str, Any, str], dict[str, Any]]


def start(link: McpLink, request_id: Any, name: str, arguments: Any, ttl_ms: int,
          answer: Answer, version: str) -> dict[str, Any]:
    """A task-augmented tools/call: the TOOL_CALL is sent and the task answered at once
    (CreateTaskResult). A call the session refused outright (an ERROR with no TOOL_DONE:
    no task exists) or an unknown tool is answered as the plain call would be."""
    task_id = tasks.new_task_id(now_ms())
    cid = tasks.call_id(task_id)
    queue = link.start_call(cid, name, arguments)
    link.forget(cid)
    early = queue.get_nowait() if not queue.empty() else None
    if early is not None and (early[0] in ("refused", "closed") or (
            (early[1].get("error") or {}).get("code") == "TOOL_NOT_FOUND")):
        return answer(request_id, early[0], early[1], version)
    state = tasks.state(link.port, task_id)
    if state is None:
        raise wire.RpcError(wire.INTERNAL_ERROR, "the task's call is not in its session")
    return wire.result(request_id, {"task": state.view(ttl_ms)})


def _state(link: McpLink, params: dict[str, Any]) -> tasks.TaskState:
    task_id = params.get("taskId")
    link.drain()  # what the session has written is in its replay window
    state = tasks.state(link.port, task_id) if isinstance(task_id, str) else None
    if state is None:
        raise wire.RpcError(wire.INVALID_PARAMS, f"no task {task_id!r} in this session "
                            "(unknown, or its result left the replay window)")
    return state


def get(link: McpLink, request_id: Any, params: dict[str, Any],
        ttl_ms: int) -> dict[str, Any]:
    return wire.result(request_id, _state(link, params).view(ttl_ms))


def result(link: McpLink, request_id: Any, params: dict[str, Any], answer: Answer,
           version: str) -> dict[str, Any]:
    """The call's own answer once the task is terminal; waits for it until then."""
    state = _state(link, params)
    cid = tasks.call_id(state.task_id)
    while state.done is None:
        queue = link.watch(cid)
        try:
            state = _state(link, params)  # it may have ended before the watch began
            if state.done is None:
                if queue is None:
                    gevent.sleep(RECHECK_SECONDS)
                else:
                    kind, _ = queue.get()
                    if kind == "closed":
                        raise wire.RpcError(wire.CONNECTION_CLOSED, "the MCP session's link "
                                            "closed (the session moved): ask again")
                state = _state(link, params)
        finally:
            if queue is not None:
                link.forget(cid)
    out = answer(request_id, "done", state.done, version)
    if "result" in out:
        out["result"]["_meta"] = {tasks.RELATED_TASK: {"taskId": state.task_id}}
    return out


def cancel(link: McpLink, request_id: Any, params: dict[str, Any],
           ttl_ms: int) -> dict[str, Any]:
    state = _state(link, params)
    if state.status in tasks.TERMINAL:
        raise wire.RpcError(wire.INVALID_PARAMS, f"task {state.task_id} is already "
                            f"{state.status}")
    link.cancel(tasks.call_id(state.task_id))
    view = state.view(ttl_ms)
    view.update(status="cancelled", lastUpdatedAt=tasks.iso(now_ms()))
    return wire.result(request_id, view)


def listing(link: McpLink, request_id: Any, ttl_ms: int) -> dict[str, Any]:
    link.drain()
    return wire.result(request_id, {"tasks": [s.view(ttl_ms)
                                              for s in tasks.all_states(link.port)]})
