"""An existing Flask app gains protoflask.

The shop below has its own pages and JSON API. Three additions make it a real-time
agent server as well:

1. ``ProtoServer(app=app)`` mounts /health, /stats and /proto/* next to the shop's
   routes, configured from the shop's own ``app.config`` (``PROTOFLASK_*`` keys).
2. ``app.register_blueprint(shop_tools)``: a ToolBlueprint (shop_tools.py) of tools.
3. blinker signal handlers keep the shop's "who is online / what did they say" view
   (``GET /api/activity``) current.

Run it (from the repository root):

    JWT_SECRET=change-me gunicorn -k gevent --chdir examples/embed app:app
    JWT_SECRET=change-me python examples/embed/app.py     # protoflask's own server
    PROTOFLASK_DEV=1 python examples/embed/app.py          # prints a development token
"""

from __future__ import annotations

from typing import Any, Mapping

from flask import Flask, current_app
from shop_tools import shop_tools

from protoflask import ProtoServer, signals

ORDERS = {
    "1001": {"order_id": "1001", "item": "teapot", "status": "shipped"},
    "1002": {"order_id": "1002", "item": "kettle", "status": "paid"},
}


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    # protoflask reads PROTOFLASK_<OPTION> keys (explicit args > app.config > env > defaults)
    app.config.from_mapping(PROTOFLASK_MAX_CONCURRENT_RUNS=4)
    app.config.update(config or {})
    shop: dict[str, Any] = {"orders": {k: dict(v) for k, v in ORDERS.items()},
                            "online": set(), "said": []}
    app.extensions["shop"] = shop

    # -- the app as it was -----------------------------------------------------------

    @app.get("/")
    def index() -> str:
        return "<h1>The teapot shop</h1><p>Ask our assistant at /proto/websocket.</p>"

    @app.get("/api/activity")
    def activity() -> dict[str, Any]:
        state = current_app.extensions["shop"]
        return {"online": sorted(state["online"]), "said": state["said"][-20:]}

    # -- what protoflask adds --------------------------------------------------------

    proto = ProtoServer(app=app)
    app.register_blueprint(shop_tools)

    # Receivers run in the server's greenlets: keep them short. connect_via holds them
    # strongly, so defining them inside create_app is fine.
    @signals.connect.connect_via(proto)
    def on_connect(sender: ProtoServer, session_id: str, **_: Any) -> None:
        shop["online"].add(session_id)

    @signals.disconnect.connect_via(proto)
    def on_disconnect(sender: ProtoServer, session_id: str, **_: Any) -> None:
        shop["online"].discard(session_id)

    @signals.text_message.connect_via(proto)
    def on_text(sender: ProtoServer, session_id: str, message: dict, **_: Any) -> None:
        if message["type"] == "MESSAGE_END":
            shop["said"].append({"session": session_id, "text": message["payload"]["text"]})

    return app


app = create_app()  # gunicorn -k gevent app:app


def main() -> None:
    proto: ProtoServer = app.extensions["protoflask"]
    proto.start()
    print(f"shop and protoflask on http://127.0.0.1:{proto.port}/")
    if proto.dev_token:
        print(f"development token: {proto.dev_token}")
    proto.serve_forever()  # until Ctrl-C or SIGTERM


if __name__ == "__main__":
    main()
