"""ToolBlueprint: tools organised like views, registered on the app's ProtoServer by
``app.register_blueprint`` (Flask's record_once hook)."""

from __future__ import annotations

import flask
import pytest
import requests
from flask import Flask

from protoflask import ProtoServer, Tool, ToolBlueprint

from ..support import SECRET, WSClient, timeout

BASE = {"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET, "enableLogging": False}
ORDER = {"type": "object", "properties": {"order_id": {"type": "string"}},
         "required": ["order_id"]}


def billing_blueprint(prefix: str | None = "billing.") -> ToolBlueprint:
    bp = ToolBlueprint("billing", prefix=prefix)

    @bp.tool(input_schema=ORDER, output_schema={"type": "object", "required": ["refunded"]})
    def refund(params, session_id, call_id, server):
        """Refund an order."""
        server.send_tool_update(session_id, call_id, "RUNNING", 50)
        return {"refunded": params["order_id"], "port": server.port}

    @bp.tool("invoice", description="Make an invoice.", inline=True)
    def make_invoice(params, session_id, call_id, server):
        return {"invoice": 1}

    return bp


def names(server: ProtoServer) -> set[str]:
    return {t.name for t in server.get_tools()}


def list_tools(client) -> dict[str, dict]:
    client.send("TOOL_LIST", "SYSTEM", {})
    return {t["name"]: t for t in client.recv_type("TOOL_LIST")["payload"]["tools"]}


def call(client, tool: str, params: dict, call_id: str) -> dict:
    client.send("TOOL_CALL", "USER", {"call_id": call_id, "tool": tool, "params": params})
    return client.recv_type("TOOL_DONE", call_id=call_id)["payload"]


def test_is_a_flask_blueprint_with_prefixed_tools() -> None:
    bp = billing_blueprint()
    assert isinstance(bp, flask.Blueprint)
    assert [t.name for t in bp.tools] == ["billing.refund", "billing.invoice"]
    refund, invoice = bp.tools
    assert refund.description == "Refund an order." and refund.input_schema == ORDER
    assert invoice.description == "Make an invoice." and invoice.inline
    assert [t.name for t in billing_blueprint(prefix=None).tools] == ["refund", "invoice"]
    assert bp.import_name == __name__  # the defining module, as Blueprint(name, __name__)


def test_registering_it_registers_its_tools_and_they_work(make_server, make_client) -> None:
    app = Flask("shop")
    server = make_server(app=app)
    app.register_blueprint(billing_blueprint())
    assert {"billing.refund", "billing.invoice", "echo", "add"} <= names(server)

    client = make_client(server, server.issue_token("alice"))
    client.hello()
    listed = list_tools(client)
    assert listed["billing.refund"]["description"] == "Refund an order."
    assert listed["billing.refund"]["inputSchema"] == ORDER
    done = call(client, "billing.refund", {"order_id": "o1"}, "c1")
    assert done == {"call_id": "c1", "status": "OK",
                    "result": {"refunded": "o1", "port": server.port}}
    assert any(m["type"] == "TOOL_UPDATE" and m["payload"]["progress"] == 50
               for m in client.received)
    bad = call(client, "billing.refund", {}, "c2")  # its inputSchema is enforced
    assert bad["status"] == "ERROR" and bad["error"]["code"] == "INVALID_MESSAGE"

    # unregistering and listing work as for any tool
    assert server.unregister_tool("billing.refund") is True
    assert server.unregister_tool("billing.refund") is False
    assert "billing.refund" not in names(server) and "billing.invoice" in names(server)
    assert "billing.refund" not in list_tools(client)
    gone = call(client, "billing.refund", {"order_id": "o1"}, "c3")
    assert gone["error"]["code"] == "TOOL_NOT_FOUND"


def test_one_blueprint_on_two_apps_registers_on_each(make_server, ws_client) -> None:
    bp = billing_blueprint()
    app_a, app_b = Flask("a"), Flask("b")
    server_a, server_b = make_server(app=app_a), make_server(app=app_b)
    app_a.register_blueprint(bp)
    app_b.register_blueprint(bp)
    for server in (server_a, server_b):
        assert {"billing.refund", "billing.invoice"} <= names(server)
        client = ws_client(server)
        client.hello()
        done = call(client, "billing.refund", {"order_id": "x"}, "c1")
        assert done["result"] == {"refunded": "x", "port": server.port}  # its own server
    server_a.unregister_tool("billing.refund")  # one server's registry only
    assert "billing.refund" not in names(server_a) and "billing.refund" in names(server_b)


def test_an_app_without_protoserver_is_refused_and_left_untouched() -> None:
    bp = billing_blueprint()
    app = Flask("bare")
    with pytest.raises(RuntimeError, match=r"no ProtoServer.*ProtoServer\(app\)"):
        app.register_blueprint(bp)
    assert app.blueprints == {}
    server = ProtoServer(BASE, app=app)  # the fix the message names
    app.register_blueprint(bp)
    assert "billing.refund" in names(server)


def test_registering_twice_on_one_app_registers_the_tools_once() -> None:
    bp = billing_blueprint()
    app = Flask("twice")
    server = ProtoServer(BASE, app=app)
    app.register_blueprint(bp)
    app.register_blueprint(bp, name="billing_again", url_prefix="/again")
    assert sorted(n for n in names(server) if n.startswith("billing.")) == \
        ["billing.invoice", "billing.refund"]


def test_nested_in_a_parent_blueprint() -> None:
    parent = flask.Blueprint("api", __name__, url_prefix="/api")
    parent.register_blueprint(billing_blueprint())
    app = Flask("nested")
    server = ProtoServer(BASE, app=app)
    app.register_blueprint(parent)
    assert "billing.refund" in names(server)


def test_a_name_taken_on_the_server_is_refused_before_anything_registers() -> None:
    app = Flask("clash")
    server = ProtoServer(BASE, app=app)
    server.register_tool(Tool("billing.invoice", "someone else's", {"type": "object"}))
    with pytest.raises(ValueError, match="billing.invoice"):
        app.register_blueprint(billing_blueprint())
    assert "billing.refund" not in names(server) and "billing" not in app.blueprints
    assert server.tools.get("billing.invoice").description == "someone else's"
    builtin_clash = ToolBlueprint("mine")  # no prefix: the built-in names are taken
    builtin_clash.tool("echo")(lambda params, *args: params)
    with pytest.raises(ValueError, match="echo"):
        app.register_blueprint(builtin_clash)


def test_tools_are_added_before_registration_and_named_once() -> None:
    bp = billing_blueprint()
    with pytest.raises(ValueError, match="already has a tool"):
        bp.tool("refund")(lambda *a: {})
    with pytest.raises(ValueError, match="inputSchema"):  # a bad schema fails at import
        bp.tool("broken", input_schema={"type": 5})(lambda *a: {})
    ProtoServer(BASE, app=(app := Flask("late")))
    app.register_blueprint(bp)
    with pytest.raises(RuntimeError, match="before app.register_blueprint"):
        bp.tool("late")(lambda *a: {})


def test_it_also_carries_views(make_server) -> None:
    bp = billing_blueprint()

    @bp.get("/status")
    def status():
        return {"billing": "up"}

    app = Flask("views")
    server = make_server(app=app)
    app.register_blueprint(bp, url_prefix="/billing")
    resp = requests.get(server.base_url + "/billing/status", timeout=timeout(5))
    assert resp.json() == {"billing": "up"}


@pytest.fixture
def ws_client():
    clients = []

    def make(server):
        client = WSClient(server.base_url, server.issue_token("alice"))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
