"""examples/embed: an existing Flask app with its own routes gains protoflask, a
ToolBlueprint of tools and signal handlers. Served for real, spoken to with WSClient."""

from __future__ import annotations

import pytest
import requests
from flask import Flask

from ..support import timeout, wait_for
from .conftest import import_example


def get(server, path: str) -> requests.Response:
    return requests.get(server.base_url + path, timeout=timeout(5))


def call(client, tool: str, params: dict, call_id: str) -> None:
    client.send("TOOL_CALL", "USER", {"call_id": call_id, "tool": tool, "params": params})


def test_the_app_keeps_its_routes_and_gains_protoflask(serve_example, ws) -> None:
    server = serve_example("embed")
    assert "teapot shop" in get(server, "/").text  # the app's own page
    assert get(server, "/api/orders/1001").json()["item"] == "teapot"  # the blueprint's view
    assert get(server, "/api/orders/nope").status_code == 404
    assert get(server, "/health").json()["status"] == "ok"  # protoflask's
    # the example's app.config (PROTOFLASK_MAX_CONCURRENT_RUNS=4) configured the server
    assert server.config.max_concurrent_runs == 4
    hello = ws(server).hello()
    assert hello["payload"]["capabilities"]["max_concurrent_runs"] == 4


def test_blueprint_tools_are_listed_and_called(serve_example, ws) -> None:
    server = serve_example("embed")
    assert {"shop.lookup", "shop.refund"} <= {t.name for t in server.get_tools()}
    client = ws(server)
    client.hello()
    client.send("TOOL_LIST", "SYSTEM", {})
    listed = {t["name"]: t for t in client.recv_type("TOOL_LIST")["payload"]["tools"]}
    assert listed["shop.refund"]["description"].startswith("Refund an order")
    assert listed["shop.lookup"]["inputSchema"]["required"] == ["order_id"]

    call(client, "shop.lookup", {"order_id": "1001"}, "l1")
    done = client.recv_type("TOOL_DONE", call_id="l1")
    assert done["payload"]["status"] == "OK" and done["payload"]["result"]["item"] == "teapot"

    call(client, "shop.refund", {"order_id": "1002"}, "r1")
    done = client.recv_type("TOOL_DONE", call_id="r1")
    assert done["payload"]["result"]["status"] == "refunded"
    progress = [m["payload"]["progress"] for m in client.received
                if m["type"] == "TOOL_UPDATE" and m["payload"]["call_id"] == "r1"]
    assert progress == [25, 50, 75]
    # the tool changed the app's own data, which its HTTP view shows
    assert get(server, "/api/orders/1002").json()["status"] == "refunded"

    call(client, "shop.lookup", {"order_id": "9999"}, "l2")
    failed = client.recv_type("TOOL_DONE", call_id="l2")["payload"]
    assert failed["status"] == "ERROR" and failed["error"]["code"] == "TOOL_EXECUTION_ERROR"


def test_signal_handlers_feed_the_apps_own_view(serve_example, ws) -> None:
    server = serve_example("embed")
    client = ws(server)
    sid = client.hello()["payload"]["session"]
    assert get(server, "/api/activity").json()["online"] == [sid]
    client.send("MESSAGE_START", "USER", {"message_id": "t1", "content_type": "text/plain"})
    client.send("MESSAGE_PART", "USER", {"message_id": "t1", "content": "is the kettle "})
    client.send("MESSAGE_PART", "USER", {"message_id": "t1", "content": "in stock?"})
    client.send("MESSAGE_END", "USER", {"message_id": "t1"})
    echoed = client.recv_type("MESSAGE_PART")  # echoMessages stays on in this app
    assert echoed["payload"]["content"] == "is the kettle in stock?"
    said = get(server, "/api/activity").json()["said"]
    assert said == [{"session": sid, "text": "is the kettle in stock?"}]
    client.close()
    wait_for(lambda: get(server, "/api/activity").json()["online"] == [],
             what="the disconnect handler to mark the session offline")


def test_module_level_app_is_the_gunicorn_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    module = import_example("embed", monkeypatch)
    assert isinstance(module.app, Flask)
    server = module.app.extensions["protoflask"]
    assert {"shop.lookup", "shop.refund"} <= {t.name for t in server.get_tools()}
    rules = {r.rule for r in module.app.url_map.iter_rules()}
    assert {"/", "/api/activity", "/api/orders/<order_id>", "/proto/websocket"} <= rules
