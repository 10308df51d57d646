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


from ..bell import Bell
from ..tool_runner import CallSink, Report, SessionToolRunner
from ..tools import ToolExecution, awaited_call, check_call

if TYPE_CHECKING:
    from ..port import AdapterPorts


def call_tool_elsewhere(ports: "AdapterPorts", session_id: str, name: str, params: dict[str, Any],
                        run_id: str | None, call_id: str, *,
                        report_error: Callable[[BaseException, str], None]) -> Any:
    """Run the tool here for a session another node holds; its result, or raise like
    ``ProtoServer.call_tool``. Runs in the server's hub (the handler's greenlet)."""
    tool = ports.tools.get(name)
    check_call(tool, name, params)
    assert tool is not None
    if tool.execute is None:
        raise ValueError(f"tool {name!r} has no execute function to call")
    def reported() -> None:  # the runner's bell: its reports, to the session's node
        if runner.pulling:
            return  # the greenlet delivering takes what came meanwhile too
        runner.pulling = True
        try:
            while runner.reports:
                deliver(runner.take_reports())
        finally:
            runner.pulling = False

    def deliver(reports: list[Report]) -> None:
        for report in reports:
            ports.report(session_id, report)  # (False: the session expired meanwhile)
            execution = report.execution
            if execution is not None and execution.on_done is not None:
                execution.on_done(execution, report.error)
            if report.raised is not None:
                report_error(report.raised, session_id)

    ports.open_call(session_id, call_id, run_id)
    runner = SessionToolRunner(CallSink(session_id, ports.tool_context,
                                        Bell(reported, apart=True)),  # delivering may block
                               1, 1, ports.config.tool_timeout)
    outcome, done = awaited_call(call_id)
    runner.submit(ToolExecution(call_id, tool.name, params, run_id=run_id, on_done=done), tool,
                  pulled=True)
    reported()
    return outcome.get()
