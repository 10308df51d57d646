"""Bare baseline: the `websockets` library's own asyncio server, echo.

    python bench/servers/websockets_asyncio_echo.py --fd N | --port P
"""

import argparse
import asyncio
import socket

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


def listener(args) -> socket.socket:
    if args.fd is not None:
        return socket.socket(fileno=args.fd)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(4096)
    return sock


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int)
    parser.add_argument("--port", type=int, default=8093)
    asyncio.run(main(listener(parser.parse_args())))
