"""The shop's tools, organised like its views: one ToolBlueprint per area of the app.

Registered with ``app.register_blueprint(shop_tools)`` once the app has its ProtoServer;
the tools become ``shop.lookup`` and ``shop.refund`` on that server. Being a real Flask
blueprint, it carries the matching JSON view too.
"""

from __future__ import annotations

from typing import Any

import gevent
from flask import abort, current_app

from protoflask import ToolBlueprint

shop_tools = ToolBlueprint("shop", prefix="shop.", url_prefix="/api")

ORDER_ID = {"type": "object", "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {"order_id": {"type": "string"},
                                          "item": {"type": "string"},
                                          "status": {"type": "string"}},
         "required": ["order_id", "status"]}


def orders_of(app: Any) -> dict[str, dict[str, Any]]:
    """The app's order book (see create_app in app.py)."""
    return app.extensions["shop"]["orders"]


@shop_tools.tool(input_schema=ORDER_ID, output_schema=ORDER, inline=True)
def lookup(params: dict[str, Any], session_id: str, call_id: str, server: Any) -> dict:
    """Look up an order by id."""
    order = orders_of(server.app).get(params["order_id"])
    if order is None:
        raise KeyError(f"no order {params['order_id']}")
    return order


@shop_tools.tool(input_schema=ORDER_ID, output_schema=ORDER)
def refund(params: dict[str, Any], session_id: str, call_id: str, server: Any) -> dict:
    """Refund an order, reporting progress as the (pretend) payment provider answers."""
    order = orders_of(server.app).get(params["order_id"])
    if order is None:
        raise KeyError(f"no order {params['order_id']}")
    for progress in (25, 50, 75):
        gevent.sleep(0.01)  # a call to the payment provider (cooperative under gevent)
        server.send_tool_update(session_id, call_id, "RUNNING", progress)
    order["status"] = "refunded"
    return order


@shop_tools.get("/orders/<order_id>")
def order_view(order_id: str) -> dict[str, Any]:
    order = orders_of(current_app).get(order_id)
    if order is None:
        abort(404)
    return order
