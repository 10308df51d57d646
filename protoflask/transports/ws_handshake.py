"""The WebSocket opening handshake's answer: the 101 (or the refusal) for an upgrade
request the WSGI server already parsed.

Two ways behind one swap point (``WebSocketConnection.accept`` tries the fast one first):
``accept_plain`` lets the ``websockets`` library negotiate, ``accept_fast`` writes the
common 101 from a template. tests/transports/test_websocket_accept.py holds them equal.
"""

from __future__ import annotations

import binascii
import email.utils
import hashlib
import re
import time
from typing import Any

from websockets.datastructures import Headers
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request
from websockets.server import ServerProtocol


def handshake_request(environ: dict[str, Any]) -> Request:
    """The upgrade request as websockets sees it, rebuilt from the WSGI environ."""
    headers = Headers()
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").title()] = value
    path = environ.get("PATH_INFO", "/")
    if environ.get("QUERY_STRING"):
        path += "?" + environ["QUERY_STRING"]
    return Request(path, headers)


def accept_plain(environ: dict[str, Any], compression: bool
                 ) -> tuple[list[bytes], list[Any], bool]:
    """The upgrade's answer as websockets makes it: (what to write, the extensions agreed,
    whether it is the 101); a refusal's writes end with b"", websockets' half-close."""
    handshake = ServerProtocol(
        extensions=[ServerPerMessageDeflateFactory()] if compression else None)
    response = handshake.accept(handshake_request(environ))
    handshake.send_response(response)
    return handshake.data_to_send(), handshake.extensions, response.status_code == 101


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_TOKEN_LIST = re.compile(r"[ \t]*[!#$%&'*+\-.^_`|~0-9A-Za-z]+(?:[ \t]*,[ \t]*"
                         r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+)*[ \t]*\Z")
_date_line: list[Any] = [0, b""]  # the second, its Date header line


def accept_fast(environ: dict[str, Any], compression: bool
                ) -> tuple[list[bytes], list[Any], bool] | None:
    """``accept_plain``'s answer to the common upgrade (no extension to negotiate: it is
    a 101 with a Date of this second), or None to leave the request to websockets (any
    other, and every refusal). Held equal by tests/transports/test_websocket_accept.py."""
    key = environ.get("HTTP_SEC_WEBSOCKET_KEY")
    connection = environ.get("HTTP_CONNECTION")
    if compression or environ.get("HTTP_SEC_WEBSOCKET_VERSION") != "13" or key is None \
            or connection is None or not key.isascii() \
            or environ.get("HTTP_UPGRADE", "").lower() != "websocket" \
            or not _TOKEN_LIST.match(connection) \
            or not any(p.strip().lower() == "upgrade" for p in connection.split(",")):
        return None
    try:  # base64.b64decode(validate=True) and b64encode, their C calls direct
        if len(binascii.a2b_base64(key.encode(), strict_mode=True)) != 16:
            return None
    except binascii.Error:
        return None
    accept = binascii.b2a_base64(hashlib.sha1((key + _WS_GUID).encode()).digest(),
                                 newline=False)
    now = int(time.time())
    if _date_line[0] != now:
        _date_line[:] = [now, f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n"
                         .encode()]
    return [b"HTTP/1.1 101 Switching Protocols\r\n" + _date_line[1]
            + b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
            + accept + b"\r\n\r\n"], [], True
