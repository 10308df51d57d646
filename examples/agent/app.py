"""A server-side agent on protoflask.

Every text a client completes (MESSAGE_END) is answered inside a run the agent starts
itself (``server.start_run``): the agent calls its ``search`` tool (``server.call_tool``;
the client sees the tool's progress as TOOL_UPDATEs and its TOOL_DONE), streams its reply
from a fake model generator with ``server.stream_text`` (tokens coalesced into
MESSAGE_PARTs, at most one part per 50 ms), and ends the run with ``server.finish_run``.
A client that sends ``RUN_CANCEL`` for the run stops the reply within one token:
``stream_text`` checks the run before every token, closes the reply with MESSAGE_END and
returns; the run has already ended ``cancelled`` (RUN_FINISHED status cancelled, the
``runCancelled`` signal). The server's own text echo is off
(``PROTOFLASK_ECHO_MESSAGES=False``): the agent answers instead.

Run it (from the repository root):

    JWT_SECRET=change-me gunicorn -k gevent --chdir examples/agent app:app
    JWT_SECRET=change-me python examples/agent/app.py     # protoflask's own server
    PROTOFLASK_DEV=1 python examples/agent/app.py          # prints a development token
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping

import gevent
import gevent.pool
from flask import Flask

from protoflask import ProtoError, ProtoServer, ToolBlueprint, ToolCancelled

log = logging.getLogger("agent")

NOTES = [
    {"title": "Runs group a reply", "text": "RUN_STARTED opens a run, RUN_FINISHED ends it."},
    {"title": "Tools report progress", "text": "TOOL_UPDATE carries progress 0-100."},
    {"title": "Cancel stops a run", "text": "RUN_CANCEL ends a run with status cancelled."},
]

FILLER = ("protoflask streams this reply token by token inside a run that you may cancel "
          "whenever you like: stream_text checks the run before every token, so a "
          "RUN_CANCEL stops the stream at once and the run ends cancelled. Tokens come "
          "from a generator here; a real model client streams them the same way.")


# -- the agent's tools -------------------------------------------------------------------

agent_tools = ToolBlueprint("agent_tools")


@agent_tools.tool(
    input_schema={"type": "object", "properties": {"query": {"type": "string"}},
                  "required": ["query"]},
    output_schema={"type": "object", "properties": {"hits": {"type": "array"}},
                   "required": ["hits"]})
def search(params: dict[str, Any], session_id: str, call_id: str, server: Any) -> dict:
    """Search the notes, slowly, reporting progress after each one."""
    delay = server.app.config["AGENT_SEARCH_DELAY"]
    words = {w.strip("?.,!").lower() for w in params["query"].split()}
    hits = []
    for i, note in enumerate(NOTES, 1):
        gevent.sleep(delay)  # a slow index (cooperative under gevent)
        if words & {w.lower() for w in note["title"].split()}:
            hits.append(note)
        server.send_tool_update(session_id, call_id, "RUNNING", round(100 * i / len(NOTES)))
    return {"hits": hits}


def fake_model(prompt: str, hits: list[dict[str, Any]], delay: float) -> Iterator[str]:
    """Stands in for a streaming model client: the reply, token by token. With a real
    SDK: ``(event.delta for event in client.responses.stream(...))``."""
    found = " ".join(f"{h['title']}: {h['text']}" for h in hits)
    reply = f"You asked: {prompt.strip()} I found {len(hits)} notes. {found} {FILLER}"
    for word in reply.split():
        gevent.sleep(delay)  # the model thinking (cooperative under gevent)
        yield word + " "


# -- the agent ---------------------------------------------------------------------------


class Agent:
    """Answers each completed text in a run of its own; RUN_CANCEL stops the answer."""

    def __init__(self, server: ProtoServer, token_delay: float) -> None:
        self.server = server
        self.token_delay = token_delay
        #: the greenlets answering right now (one per open run)
        self.answers = gevent.pool.Group()
        server.on("textMessage", self.on_text)

    def on_text(self, session_id: str, message: dict[str, Any]) -> None:
        if message["type"] != "MESSAGE_END":
            return
        text_id = message["payload"]["message_id"]
        try:  # the run starts here, so a RUN_CANCEL can never come before we know it
            run = self.server.start_run(session_id, metadata={"in_reply_to": text_id})
        except ProtoError as exc:  # e.g. MAX_RUNS_EXCEEDED: this text goes unanswered
            log.warning("session %s: cannot start a run: %s", session_id, exc)
            return
        # answer in a greenlet of its own: this listener runs in the connection's greenlet
        self.answers.spawn(self.answer, session_id, run["runId"], message["payload"]["text"])

    def answer(self, session_id: str, run_id: str, prompt: str) -> None:
        server = self.server
        try:
            result = server.call_tool(session_id, "search", {"query": prompt}, run_id=run_id)
            reply = server.stream_text(
                session_id, fake_model(prompt, result["hits"], self.token_delay), run_id=run_id)
            if reply.complete:  # else RUN_CANCEL (the run already ended) or session gone
                server.finish_run(session_id, run_id,
                                  summary={"parts": reply.parts, "chars": len(reply.text)})
        except ToolCancelled:
            pass  # RUN_CANCEL during the search: the run already ended cancelled
        except ProtoError as exc:  # the session expired, or the client ended the run
            log.info("session %s run %s: %s", session_id, run_id, exc)
        except Exception as exc:
            log.exception("session %s run %s failed", session_id, run_id)
            try:
                server.finish_run(session_id, run_id,
                                  error={"code": "AGENT_ERROR", "message": str(exc)})
            except ProtoError:
                pass


# -- the app -------------------------------------------------------------------------------


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(
        PROTOFLASK_ECHO_MESSAGES=False,  # the agent answers text itself
        AGENT_TOKEN_DELAY=0.05,  # seconds between streamed tokens
        AGENT_SEARCH_DELAY=0.1,  # seconds per note the search tool reads
    )
    app.config.update(config or {})
    proto = ProtoServer(app=app)
    app.register_blueprint(agent_tools)
    app.extensions["agent"] = Agent(proto, app.config["AGENT_TOKEN_DELAY"])
    return app


app = create_app()  # gunicorn -k gevent app:app


def main() -> None:
    proto: ProtoServer = app.extensions["protoflask"]
    proto.start()
    print(f"agent on ws://127.0.0.1:{proto.port}/proto/websocket")
    if proto.dev_token:
        print(f"development token: {proto.dev_token}")
    proto.serve_forever()  # until Ctrl-C or SIGTERM


if __name__ == "__main__":
    main()
