"""A server-side agent on protoflask.

Every text a client completes (MESSAGE_END) is answered inside a run the agent starts
itself (``server.start_run``): the agent calls its ``search`` tool (``server.call_tool``;
the client sees the tool's progress as TOOL_UPDATEs and its TOOL_DONE), streams its reply
from a fake model generator as MESSAGE_PART tokens, and ends the run with
``server.finish_run``. A client that sends ``RUN_CANCEL`` for the run stops the reply
within one token: the run ends ``cancelled`` (RUN_FINISHED status cancelled, the
``runCancelled`` signal), the open reply is closed with MESSAGE_END, and nothing more is
streamed. The server's own text echo is off (``PROTOFLASK_ECHO_MESSAGES=False``): the
agent answers instead.

Run it (from the repository root):

    JWT_SECRET=change-me gunicorn -k gevent --chdir examples/agent app:app
    JWT_SECRET=change-me python examples/agent/app.py     # protoflask's own server
    PROTOFLASK_DEV=1 python examples/agent/app.py          # prints a development token
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping

import gevent
from flask import Flask

from protoflask import ProtoError, ProtoServer, Run, ToolBlueprint, ToolCancelled, messages

log = logging.getLogger("agent")

NOTES = [
    {"title": "Runs group a reply", "text": "RUN_STARTED opens a run, RUN_FINISHED ends it."},
    {"title": "Tools report progress", "text": "TOOL_UPDATE carries progress 0-100."},
    {"title": "Cancel stops a run", "text": "RUN_CANCEL ends a run with status cancelled."},
]

FILLER = ("protoflask streams this reply one token at a time inside a run that you may "
          "cancel whenever you like: the agent checks its run before every token, so a "
          "RUN_CANCEL stops the stream at once and the run ends cancelled. Tokens come "
          "from a generator here; a real model client would stream them the same way.")


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


def fake_model(prompt: str, hits: list[dict[str, Any]]) -> Iterator[str]:
    """Stands in for a streaming model client: the reply, token by token."""
    found = " ".join(f"{h['title']}: {h['text']}" for h in hits)
    reply = f"You asked: {prompt.strip()} I found {len(hits)} notes. {found} {FILLER}"
    for word in reply.split():
        yield word + " "


# -- the agent ---------------------------------------------------------------------------


class Agent:
    """Answers each completed text in a run of its own; RUN_CANCEL stops the answer."""

    def __init__(self, server: ProtoServer, token_delay: float) -> None:
        self.server = server
        self.token_delay = token_delay
        #: (session_id, run_id) -> the greenlet answering in that run
        self.active: dict[tuple[str, str], gevent.Greenlet] = {}
        server.on("textMessage", self.on_text)
        server.on("runCancelled", self.on_run_cancelled)

    def on_text(self, session_id: str, message: dict[str, Any]) -> None:
        if message["type"] != "MESSAGE_END":
            return
        text_id = message["payload"]["message_id"]
        try:  # the run starts here, so a RUN_CANCEL can never come before we know it
            run = self.server.start_run(session_id, metadata={"in_reply_to": text_id})
        except ProtoError as exc:  # e.g. MAX_RUNS_EXCEEDED: this text goes unanswered
            log.warning("session %s: cannot start a run: %s", session_id, exc)
            return
        key = (session_id, run["runId"])
        self.active[key] = gevent.spawn(self.answer, session_id, run["runId"],
                                        message["payload"]["text"])

    def on_run_cancelled(self, session_id: str, run: Run) -> None:
        greenlet = self.active.pop((session_id, run.run_id), None)
        if greenlet is not None:
            # Stop at the next switch (a token's sleep or the tool call); answer() also
            # checks ``active`` before each token, so none is sent after this point.
            greenlet.kill(block=False)

    def answer(self, session_id: str, run_id: str, prompt: str) -> None:
        key = (session_id, run_id)
        server = self.server
        reply_id: str | None = None
        try:
            result = server.call_tool(session_id, "search", {"query": prompt}, run_id=run_id)
            reply_id = f"{run_id}-reply"
            self._send(session_id, messages.text_start(reply_id))
            tokens = 0
            for token in fake_model(prompt, result["hits"]):
                if key not in self.active:
                    return  # cancelled
                self._send(session_id, messages.text_part(reply_id, token))
                tokens += 1
                gevent.sleep(self.token_delay)
            self._send(session_id, messages.text_end(reply_id))
            reply_id = None
            server.finish_run(session_id, run_id, summary={"tokens": tokens})
        except (ToolCancelled, gevent.GreenletExit):
            pass  # RUN_CANCEL (or TOOL_CANCEL): the run already ended cancelled
        except ProtoError as exc:  # the session expired, or the client ended the run
            log.info("session %s run %s: %s", session_id, run_id, exc)
        except Exception as exc:
            log.exception("session %s run %s failed", session_id, run_id)
            try:
                server.finish_run(session_id, run_id,
                                  error={"code": "AGENT_ERROR", "message": str(exc)})
            except ProtoError:
                pass
        finally:
            if reply_id is not None:  # close a reply the cancel interrupted
                try:
                    self._send(session_id, messages.text_end(reply_id))
                except ProtoError:
                    pass
            if self.active.get(key) is gevent.getcurrent():
                del self.active[key]

    def _send(self, session_id: str, out: messages.Outbound) -> None:
        self.server.send_message(session_id, out.to_dict())


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
