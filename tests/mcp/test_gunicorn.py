"""/proto/mcp under gunicorn's gevent worker (``gunicorn -k gevent wsgi:app``, where
protoflask's own app answers MCP POSTs in front of Flask), with the official Python
client: the built-ins listed and called, an initialize refused without a token."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import requests

from ..support import SECRET, GunicornServer, timeout
from .conftest import mcp_session

pytest.importorskip("mcp")


def test_python_sdk_against_gunicorn() -> None:
    from protoflask.auth import TokenAuthority

    server = GunicornServer()
    try:
        token = TokenAuthority(SECRET).issue("gunicorn-user")
        url = f"{server.base_url}/proto/mcp"

        async def main() -> Any:
            async with mcp_session(url, token) as session:
                names = {t.name for t in (await session.list_tools()).tools}
                return names, await session.call_tool("echo", {"message": "gunicorn"})

        names, echoed = anyio.run(main)
        assert names == {"echo", "add"}
        assert echoed.structured_content == {"echoed": "gunicorn"}
        refused = requests.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                           "params": {}}, timeout=timeout(5))
        assert refused.status_code == 401
    finally:
        server.stop()
