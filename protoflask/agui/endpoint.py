"""The AG-UI endpoint (docs/AGUI.md): an AG-UI run's event stream is a live transport of
the session that holds its thread.

    POST /proto/agui                 RunAgentInput -> 200 text/event-stream, one run
    GET  /proto/agui?thread=&run=    + Last-Event-ID: re-attach to a run (extension)
    POST /proto/agui/stop            {"threadId", "runId"}: cancel it (extension)

The endpoint admits a run (auth, the thread's session, the connection limit) through
the adapters' ports (``port.AdapterPorts``) and gives its stream (``agui/stream.py``'s
``AguiStream``, which holds only a ``SessionPort``) its port. It acts for the AG-UI
client on the native side: the session gets a HELLO when it is made, each run ACKs what
came before it, and the stream answers the heartbeat's PINGs; AG-UI clients know nothing
of these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import orjson
from flask import Request, Response, request

from ..auth import token_from_request
from ..clock import now_ms
from ..core.errors import InvalidMessage, ProtoError, RunNotFound, SessionNotFound
from ..transports.http import error_response, json_response
from ..transports.request_body import read_body
from .input import RunInput, parse_run_input, thread_session_id
from .lost import handler_metadata
from .mapping import RunTranslator
from .run import AguiServices, start_run_handler
from .stream import KIND, AguiStream, native_message

if TYPE_CHECKING:
    from ..port import AdapterPorts, SessionPort

#: The HELLO a thread's session gets for its AG-UI client: every type (an accept_events
#: list would drop AGUI_EVENT, which the server does not know as a type of its own).
NATIVE_HELLO = {"proto_version": "1.1.2", "accept_major": [1]}


def upstream(port: "SessionPort", mtype: str, channel: str, payload: dict[str, Any]) -> None:
    """A native message from the AG-UI client's side, into a session this process holds."""
    port.receive(native_message(port.id, port.upstream_seq + 1, mtype, channel, payload))


def _user(ports: "AdapterPorts", request: Request) -> str:
    return ports.user(
        token_from_request(request.args.get("token"), request.headers.get("Authorization")),
        request.args.get("ticket"))


def _thread_session(ports: "AdapterPorts", user_id: str, thread_id: str) -> "SessionPort":
    """The thread's session: held here, taken over from another worker, or a new one."""
    session_id = thread_session_id(user_id, thread_id)
    try:
        return ports.session(session_id, user_id, KIND)
    except SessionNotFound:
        port = ports.create(user_id, KIND, session_id)
        upstream(port, "HELLO", "SYSTEM", NATIVE_HELLO)
        return port


def run(ports: "AdapterPorts", request: Request,
        services: Callable[[], AguiServices]) -> Response:
    """POST /proto/agui: start the run and stream its events; or an HTTP error with the
    contract's JSON body before any event."""
    try:
        user_id = _user(ports, request)
        ports.open_body(user_id)
        try:
            body = read_body(request.environ, ports.limits.max_message_size,
                             ports.limits.body_timeout)
        finally:
            ports.close_body(user_id)
        run_input: RunInput = parse_run_input(body)
        port = _thread_session(ports, user_id, run_input.thread_id)
        state = ports.state(port)
        active = [r for r, run in state.runs.items() if run.status == "active"]
        if active:
            raise InvalidMessage(f"thread {run_input.thread_id!r} has an active run "
                                 f"{active[0]!r}; stop it or wait for its end")
        ports.connect(port)
    except ProtoError as exc:
        ports.refused(exc)
        return error_response(exc)
    try:
        # the previous runs' events are the client's now: they leave the replay window
        if state.downstream_seq:
            upstream(port, "ACK", "SYSTEM", {"seq": str(state.downstream_seq)})
        # the stream replays from here: while no transport is attached, what the session
        # sends goes straight into its replay window
        port.last_seq = state.downstream_seq
        ports.start_run(port, run_input.run_id, run_input.thread_id, handler_metadata(ports))
    except ProtoError as exc:
        ports.disconnect(port)
        return error_response(exc)
    stream = AguiStream(port, request.environ,
                        RunTranslator(run_input.thread_id, run_input.run_id))
    response = stream.response()
    start_run_handler(services(), port.id, run_input)
    return response


def reattach(ports: "AdapterPorts", request: Request) -> Response:
    """GET /proto/agui?thread=&run=: the run's events after Last-Event-ID (all of them
    without one), a join prelude first; up to its terminal event."""
    try:
        thread_id, run_id = request.args.get("thread"), request.args.get("run")
        if not thread_id or not run_id:
            raise InvalidMessage("thread and run query parameters are required")
        after = _last_event_id(request)
        user_id = _user(ports, request)
        port = ports.session(thread_session_id(user_id, thread_id), user_id, KIND)
        start = run_start_seq(port, run_id)
        if start is None:
            raise RunNotFound(f"run {run_id!r} of thread {thread_id!r} is not in the "
                              "thread's replay window")
        ports.connect(port)
    except ProtoError as exc:
        ports.refused(exc)
        return error_response(exc)
    port.last_seq = start - 1
    stream = AguiStream(port, request.environ,
                        RunTranslator(thread_id, run_id, resume_after=after))
    return stream.response()


def stop(ports: "AdapterPorts", request: Request) -> Response:
    """POST /proto/agui/stop {"threadId", "runId"}: cancel the run server-side (its
    stream ends with RUN_FINISHED outcome cancelled); 200 {"stopped": true}."""
    try:
        user_id = _user(ports, request)
        obj = orjson.loads(request.get_data() or b"{}")
        thread_id = obj.get("threadId") if isinstance(obj, dict) else None
        run_id = obj.get("runId") if isinstance(obj, dict) else None
        if not isinstance(thread_id, str) or not isinstance(run_id, str):
            raise InvalidMessage("stop needs {\"threadId\": string, \"runId\": string}")
        session_id = thread_session_id(user_id, thread_id)
        port = ports.held(session_id, user_id, KIND)
        if port is None:  # clustered: the worker that holds the thread cancels it
            _stop_elsewhere(ports, session_id, user_id, run_id)
        else:
            run = ports.state(port).runs.get(run_id)
            if run is None or run.status != "active":
                raise RunNotFound(f"no active run {run_id!r} in thread {thread_id!r}")
            upstream(port, "RUN_CANCEL", "USER", {"run_id": run_id})
    except orjson.JSONDecodeError:
        return error_response(InvalidMessage("the stop body is not JSON"))
    except ProtoError as exc:
        return error_response(exc)
    return json_response({"stopped": True})


#: How far above the upstream seq another worker last recorded a message sent from here
#: into the session it holds goes (a stop's RUN_CANCEL, a moved run's RUN_FINISHED):
#: the holder may have taken a few PONGs since (a seq it saw is dropped as a resend), and
#: one above the highest is always new (docs/PROTOCOL.md §2.2).
STOP_SEQ_GAP = 512


def _stop_elsewhere(ports: "AdapterPorts", session_id: str, user_id: str, run_id: str) -> None:
    """RUN_CANCEL to the thread's session on the worker that holds it (a cluster)."""
    info = ports.lookup(session_id)
    if info is None or info.get("userId") != user_id:
        raise SessionNotFound(f"no session {session_id!r} for this user")
    if run_id not in info.get("activeRuns", ()):
        raise RunNotFound(f"no active run {run_id!r} in this thread")
    upstream_elsewhere(ports, session_id, info, "RUN_CANCEL", {"run_id": run_id})


def finish_elsewhere(ports: "AdapterPorts", session_id: str, run_id: str, summary: Any,
                     error: Any) -> None:
    """End a run whose session moved to another worker while its handler ran here (a
    re-attach there): a RUN_FINISHED from the client's side, which the holder answers
    like its own. The native message has no error, so a failure's goes in the summary
    (RUN_FINISHED ``result: {"error": ...}``, docs/AGUI.md)."""
    info = ports.lookup(session_id)
    if info is None or run_id not in info.get("activeRuns", ()):
        return  # ended meanwhile (stopped), or the session is gone
    payload: dict[str, Any] = {"run_id": run_id}
    if error is not None:
        payload["summary"] = {"error": error}
    elif summary is not None:
        payload["summary"] = summary
    upstream_elsewhere(ports, session_id, info, "RUN_FINISHED", payload)


def upstream_elsewhere(ports: "AdapterPorts", session_id: str, info: dict[str, Any], mtype: str,
                       payload: dict[str, Any]) -> None:
    """A native USER message into a session another worker holds (``info``: its
    ``hub.lookup``), forwarded there; its seq is a new one (STOP_SEQ_GAP)."""
    seq = int(info.get("lastClientSeq") or 0) + STOP_SEQ_GAP
    ports.forward(session_id, info["userId"], orjson.dumps({
        "id": f"agui-{mtype.lower()}-{seq}", "session": session_id, "seq": str(seq),
        "ts": str(now_ms()), "type": mtype, "channel": "USER", "payload": payload}))


def run_start_seq(port: "SessionPort", run_id: str) -> int | None:
    """The seq of the run's RUN_STARTED in the session's replay window, if it is there."""
    for seq, _, data in port.replay_window:
        if b'"RUN_STARTED"' in data:
            env = orjson.loads(data)
            if env.get("type") == "RUN_STARTED" and \
                    env.get("payload", {}).get("run_id") == run_id:
                return int(seq)
    return None


def _last_event_id(request: Request) -> int | None:
    header = request.headers.get("Last-Event-ID", "").strip() or \
        request.args.get("last_event_id", "").strip()
    if not header:
        return None
    if not header.isdigit():
        raise InvalidMessage(f"Last-Event-ID must be an event id (digits), got {header[:80]!r}")
    return int(header)


def add_agui_routes(bp: Any, ports: "AdapterPorts",
                    services: Callable[[], AguiServices]) -> None:
    """Mount the three AG-UI routes on the blueprint (CORS and OPTIONS as for the rest)."""
    @bp.post("/proto/agui")
    def agui_run() -> Response:
        return run(ports, request, services)

    @bp.get("/proto/agui")
    def agui_reattach() -> Response:
        return reattach(ports, request)

    @bp.post("/proto/agui/stop")
    def agui_stop() -> Response:
        return stop(ports, request)

