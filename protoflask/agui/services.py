"""What an AG-UI run needs of the server (``AguiServices``), built from the server's bound
methods and the adapters' ports below it (``port.AdapterPorts``), wherever the run's
thread session lives: a re-attach on another node of a cluster moves the session there
while the handler runs here."""

from __future__ import annotations

import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from ..core import messages
from .. import signals
from .endpoint import finish_elsewhere
from .remote_tool import call_tool_elsewhere
from .run import AguiRun, AguiServices
from .socket import SocketAgui

if TYPE_CHECKING:
    from ..port import AdapterPorts


def agui_services(ports: "AdapterPorts", *, call: Callable[..., Any],
                  call_tool: Callable[..., Any], send_message: Callable[..., None],
                  finish_run: Callable[..., Any],
                  report_error: Callable[[BaseException, str], None],
                  handler: Callable[[AguiRun], Any] | None) -> AguiServices:
    """``call(fn, *args)`` runs ``fn`` in the server's hub (ProtoServer._call); the
    others are the server's own methods of those names."""
    def tool_call(session_id: str, name: str, params: Any, *, run_id: str | None = None,
                  call_id: str | None = None) -> Any:
        if call(ports.here, session_id) is not None or call(ports.lookup, session_id) is None:
            return call_tool(session_id, name, params, run_id=run_id, call_id=call_id)
        # the session moved to another node (a re-attach there): the call runs here
        return call(partial(call_tool_elsewhere, report_error=report_error),
                    ports, session_id, name, dict(params or {}), run_id,
                    call_id or f"agent-{uuid.uuid4().hex[:16]}")

    def run_status(session_id: str, run_id: str) -> str | None:
        def read() -> str | None:
            port = ports.here(session_id)
            if port is None:  # moved to another node (or gone)
                info = ports.lookup(session_id)
                return "active" if info and run_id in info["activeRuns"] else None
            run = ports.state(port).runs.get(run_id)
            return run.status if run is not None else None
        return call(read)

    def watch_run(session_id: str, run_id: str) -> Callable[[], str | None]:
        """A stream's ``stop_reason`` for a run: None while it is active, else
        ``run_<status>``. While the session is held here it reads the status of the run
        it found (as ProtoServer.stream_text's does: no hop to the hub per chunk, and a
        stopped run's reason is ``run_cancelled``); once the session moved, it asks
        ``run_status`` (through the cluster; ``run_finished`` for a run gone)."""
        def held() -> tuple[Any, Any]:
            port = ports.here(session_id)
            return port, (ports.state(port).runs.get(run_id) if port is not None else None)
        port, run = call(held)

        def stop_reason() -> str | None:
            if run is not None and ports.is_current(port):
                status = run.status
            else:
                status = run_status(session_id, run_id) or "finished"
            return None if status == "active" else f"run_{status}"
        return stop_reason

    def deliver(session_id: str, out: messages.Outbound) -> bool:
        return bool(call(ports.send, session_id, out))  # False: expired meanwhile

    def finish(session_id: str, run_id: str, summary: Any = None, error: Any = None) -> None:
        if call(ports.here, session_id) is not None:
            finish_run(session_id, run_id, summary=summary, error=error)
        else:
            call(finish_elsewhere, ports, session_id, run_id, summary, error)

    return AguiServices(deliver=deliver, call_tool=tool_call, send_message=send_message,
                        finish_run=finish, run_status=run_status, watch_run=watch_run,
                        report_error=report_error,
                        handler=handler, echo=ports.config.echo_messages,
                        max_message_size=ports.config.max_message_size)


def install_socket_agui(server: Any, ports: Callable[[], "AdapterPorts"],
                        services: Callable[[], AguiServices]) -> SocketAgui:
    """AG-UI events on the server's WebSockets (agui/socket.py): its receivers, for the
    transports that attach, the first HELLOs and the runs started. The signals hold them
    weakly: the server keeps the returned object (else a server could never be freed)."""
    socket_agui = SocketAgui(ports, services)
    signals.connect.connect(socket_agui.on_attached, sender=server)
    signals.handshake.connect(socket_agui.on_attached, sender=server)
    signals.run_started.connect(socket_agui.on_run_started, sender=server)
    return socket_agui
