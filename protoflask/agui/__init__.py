"""AG-UI (https://docs.ag-ui.com) for protoflask: an adapter on the engine's public
surface (docs/AGUI.md). ``mapping`` turns a session's messages into one run's AG-UI
events, ``input`` checks a RunAgentInput, ``run`` is the application's side of a run,
``endpoint`` the routes and the event stream, ``socket`` the same events on the native
WebSocket (an extension a client asks for in its HELLO), ``lost`` the runs whose handler
died with its node, ``remote_tool`` a handler's tool call after its session moved."""
