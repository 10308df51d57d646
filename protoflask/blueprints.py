"""ToolBlueprint: organise tools the way Flask organises views.

    billing = ToolBlueprint("billing", prefix="billing.")

    @billing.tool(input_schema={"type": "object", "required": ["order_id"]})
    def refund(params, session_id, call_id, server):
        "Refund an order."
        return {"refunded": params["order_id"]}

    app = Flask(__name__)
    ProtoServer(app=app)              # first: the app needs its ProtoServer
    app.register_blueprint(billing)   # registers the tool "billing.refund" on it

A ToolBlueprint is a real ``flask.Blueprint`` (it may carry views, hooks, a url_prefix
too). Its tools are registered on ``app.extensions["protoflask"]`` through Flask's
``record_once`` hook, so registering it on several apps registers its tools on each
app's server, and registering it twice on one app (under another ``name=``) registers
them once. Registered tools are ordinary tools of that server: ``server.get_tools()``
lists them and ``server.unregister_tool("billing.refund")`` removes them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from flask import Blueprint

from .tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from flask.sansio.app import App
    from flask.sansio.blueprints import BlueprintSetupState


@runtime_checkable
class ToolHost(Protocol):
    """What a blueprint needs of the app's ProtoServer (``app.extensions["protoflask"]``)."""

    tools: ToolRegistry

    def register_tool(self, tool: Tool) -> None: ...


class ToolBlueprint(Blueprint):
    def __init__(self, name: str, prefix: str | None = None, *,
                 import_name: str | None = None, **blueprint_options: Any) -> None:
        """``prefix`` is put in front of every tool name (``"billing."`` makes
        ``refund`` the tool ``billing.refund``). ``import_name`` defaults to the calling
        module's name; other keyword arguments go to ``flask.Blueprint``."""
        if import_name is None:
            import_name = sys._getframe(1).f_globals.get("__name__", "__main__")
        super().__init__(name, import_name, **blueprint_options)
        self.prefix = prefix or ""
        self._tools: list[Tool] = []
        self._registered = False
        self.record_once(self._register_tools)

    @property
    def tools(self) -> list[Tool]:
        """The tools this blueprint registers (names with the prefix)."""
        return list(self._tools)

    def tool(self, name: str | None = None, *, description: str | None = None,
             input_schema: dict[str, Any] | None = None,
             output_schema: dict[str, Any] | None = None, timeout: float | None = None,
             inline: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator like ``ProtoServer.tool``: ``execute(params, session_id, call_id,
        server)``; the name defaults to the function's, the description to its
        docstring. Schemas are checked here, so a bad one fails at import."""
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_tool(Tool.from_function(
                fn, self.prefix + (name or fn.__name__), description=description,
                input_schema=input_schema, output_schema=output_schema, timeout=timeout,
                inline=inline))
            return fn
        return decorate

    def add_tool(self, tool: Tool) -> None:
        """Add a ready-made Tool (its name is taken as is, without the prefix)."""
        if not isinstance(tool, Tool):
            raise TypeError("add_tool takes a protoflask.Tool")
        if self._registered:
            raise RuntimeError(
                f"ToolBlueprint {self.name!r} is already registered on an app; add its tools "
                "before app.register_blueprint()")
        if any(t.name == tool.name for t in self._tools):
            raise ValueError(f"ToolBlueprint {self.name!r} already has a tool {tool.name!r}")
        self._tools.append(tool)

    def register(self, app: "App", options: dict[str, Any]) -> None:
        # Checked before Flask records anything, so a refused registration leaves the app
        # as it was (and can be retried once the ProtoServer exists).
        server = _server_of(app)
        if server is None:
            raise RuntimeError(
                f"cannot register ToolBlueprint {self.name!r}: the Flask app {app.name!r} has "
                "no ProtoServer. Create ProtoServer(app) (or call server.init_app(app)) first, "
                "then app.register_blueprint(...)")
        taken = [t.name for t in self._tools if server.tools.get(t.name) not in (None, t)]
        if taken:
            raise ValueError(
                f"cannot register ToolBlueprint {self.name!r}: the ProtoServer of app "
                f"{app.name!r} already has a different tool named {', '.join(taken)} "
                "(give the blueprint a prefix)")
        super().register(app, options)
        self._registered = True

    def _register_tools(self, state: "BlueprintSetupState") -> None:
        """Flask's record_once hook: once per app, however often it is registered."""
        server = _server_of(state.app)
        assert server is not None  # register() checked
        for tool in self._tools:
            server.register_tool(tool)


def _server_of(app: "App") -> ToolHost | None:
    server = app.extensions.get("protoflask")
    return server if isinstance(server, ToolHost) else None
