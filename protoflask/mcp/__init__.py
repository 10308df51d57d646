"""The Model Context Protocol adapter: /proto/mcp serves the registered tools to MCP
clients over the Streamable HTTP transport (docs/MCP.md). It sits beside ``web`` and asks
the session layer only through the port (``port.AdapterPorts``): an MCP session holds a
protoflask session through a transport of its own (``link``), and a tools/call is a
native TOOL_CALL."""

from .endpoint import Answer, McpEndpoint, add_mcp_routes

__all__ = ["Answer", "McpEndpoint", "add_mcp_routes"]
