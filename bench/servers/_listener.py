"""The listening socket every bare echo server uses: the fd bench/run.py passes, or a
port of its own when run by hand."""

from __future__ import annotations

import argparse
import socket


def listener(default_port: int) -> socket.socket:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int)
    parser.add_argument("--port", type=int, default=default_port)
    args = parser.parse_args()
    if args.fd is not None:
        return socket.socket(fileno=args.fd)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(4096)
    return sock
