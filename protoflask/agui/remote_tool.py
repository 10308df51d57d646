"""``run.call_tool`` when the run's thread session has moved to another node of a cluster
(a re-attach there) while its handler goes on here (docs/AGUI.md, "Re-attach").

The call opens on the node that holds the session (the hub's ``OpenCall`` delivery, which
the cluster carries), and runs here, in a tool runner of its own
whose TOOL_UPDATEs and TOOL_DONE go to the session through the cluster, like a call that
kept running here after its session moved: the tool's timeout, output check and failure
reporting are the runner's, as for any call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable


from ..core.errors import ProtoError
from ..live import FailCall, OpenCall, Operation, ToolDone, ToolUpdate
from ..tools import CallSink, SessionToolRunner, Tool, ToolExecution, awaited_call, check_call

if TYPE_CHECKING:
    from ..engine import Engine


def call_tool_elsewhere(engine: "Engine", session_id: str, name: str, params: dict[str, Any],
                        run_id: str | None, call_id: str, *,
                        invoke: Callable[[Tool, Any, str, str], Any],
                        report_error: Callable[[BaseException, str], None]) -> Any:
    """Run the tool here for a session another node holds; its result, or raise like
    ``ProtoServer.call_tool``. Runs in the server's hub (the handler's greenlet)."""
    tool = engine.tools.get(name)
    check_call(tool, name, params)
    assert tool is not None
    if tool.execute is None:
        raise ValueError(f"tool {name!r} has no execute function to call")
    hub = engine.hub

    def send(op: Operation) -> bool:
        try:
            return bool(hub.deliver(session_id, op))
        except ProtoError:  # the session expired meanwhile
            return False

    def update(cid: str, status: str, progress: float | None = None,
               partial: Any = None) -> bool:
        return send(ToolUpdate(cid, status, progress, partial))

    def done_(cid: str, status: str, result: Any = None,
              error: ProtoError | None = None) -> bool:
        return send(ToolDone(cid, status, result, error))

    send(OpenCall(call_id, run_id))
    sink = CallSink(session_id, update=update, done=done_,
                    fail=lambda cid, exc: send(FailCall(cid, exc)),
                    invoke=invoke, tool_failed=report_error)
    runner = SessionToolRunner(sink, 1, 1, engine.config.tool_timeout)
    outcome, done = awaited_call(call_id)
    runner.submit(ToolExecution(call_id, tool.name, params, run_id=run_id, on_done=done), tool)
    return outcome.get()
