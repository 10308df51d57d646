"""A live protoflask with an AG-UI handler for ProtoAgent's tests (test/agui.test.mjs).
Prints one JSON line {"url", "token"} when serving, then serves until stdin closes.

The handler, by the last user message: "slow" streams 12 chunks 30 ms apart; "kick"
does the same but closes every live transport after the 4th chunk (as a failing proxy
would), so the client's stream breaks mid-run while the run goes on; else the echo."""

from __future__ import annotations

import json
import sys

import gevent

from protoflask import ProtoServer

SECRET = "ts-client-agui-tests-secret-0123456789"


def main() -> None:
    server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                          "enableLogging": False})

    @server.agui_handler
    def handle(run):  # type: ignore[no-untyped-def]
        text = run.last_user_text or ""
        if text not in ("slow", "kick"):
            run.stream_text([f"echo: {text}"], max_delay_ms=0)
            return None

        def chunks():  # type: ignore[no-untyped-def]
            for i in range(12):
                gevent.sleep(0.03)
                if text == "kick" and i == 4:
                    server.close_all_connections()
                yield f"c{i} "
        run.stream_text(chunks(), max_delay_ms=0)
        return {"chunks": 12}

    server.start()
    print(json.dumps({"url": f"http://127.0.0.1:{server.port}",
                      "token": server.issue_token("agui-user")}), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
