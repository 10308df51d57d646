"""Bare baseline: the `websockets` library's own asyncio server, echo.

    python bench/servers/websockets_asyncio_echo.py --fd N | --port P
"""

import asyncio
import socket

from _listener import listener
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


async def echo(ws) -> None:
    try:
        async for message in ws:
            await ws.send(message)
    except ConnectionClosed:
        pass  # the bench drops its connections without a close frame


async def main(sock: socket.socket) -> None:
    async with serve(echo, sock=sock, compression=None, max_size=None, ping_interval=None,
                     process_request=None) as server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(listener(8093)))
