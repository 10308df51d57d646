"""The client socket under a WSGI request, for the transports that need it (the WebSocket
takes it over; the HTTP streams watch it for the client going away)."""

from __future__ import annotations

import socket
from typing import Any


def raw_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The client socket under gunicorn or protoflask's own gevent server."""
    return environ.get("gunicorn.socket") or environ.get("protoflask.socket")


def shutdown(sock: socket.socket | None, how: int = socket.SHUT_RDWR) -> None:
    """Shut a socket down, ignoring one that is already gone."""
    if sock is None:
        return
    try:
        sock.shutdown(how)
    except OSError:
        pass
