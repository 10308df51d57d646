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
_date_line: list[Any] = [0, b""]  # the second, the 101's head with its Date line

#: The swap point of the Connection header's two tests (``accept_fast``'s and the
#: upgrade's): each verdict remembered by the header's exact value (a client sends the
#: same one every time; 64 values kept per test), or with False worked out every time.
#: tests/transports/test_websocket_accept.py holds the verdicts equal both ways.
REMEMBER_CONNECTION = True
_CONNECTION_MAX = 64
_upgrade_listed: dict[str, bool] = {}
_asks_upgrade: dict[str, bool] = {}


def upgrade_listed(connection: str) -> bool:
    """``accept_fast``'s test of a Connection header: a well-formed token list (websockets'
    rule) with "upgrade" in it, any case."""
    known = _upgrade_listed.get(connection) if REMEMBER_CONNECTION else None
    if known is None:
        known = bool(_TOKEN_LIST.match(connection)) and any(
            p.strip().lower() == "upgrade" for p in connection.split(","))
        if REMEMBER_CONNECTION and len(_upgrade_listed) < _CONNECTION_MAX:
            _upgrade_listed[connection] = known
    return known


def asks_upgrade(connection: str) -> bool:
    """werkzeug's test that a request is a WebSocket's (``SessionPostLane.upgrade``'s): an
    "upgrade" among the header's comma-separated values, lower-cased, blanks and tabs
    around it stripped."""
    known = _asks_upgrade.get(connection) if REMEMBER_CONNECTION else None
    if known is None:
        known = any(v.strip(" \t") == "upgrade" for v in connection.lower().split(","))
        if REMEMBER_CONNECTION and len(_asks_upgrade) < _CONNECTION_MAX:
            _asks_upgrade[connection] = known
    return known


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
            or not upgrade_listed(connection):
        return None
    try:  # base64.b64decode(validate=True) and b64encode, their C calls direct
        if len(binascii.a2b_base64(key.encode(), strict_mode=True)) != 16:
            return None
    except binascii.Error:
        return None
    accept = binascii.b2a_base64(hashlib.sha1((key + _WS_GUID).encode()).digest(),
                                 newline=False)
    now = int(time.time())
    if _date_line[0] != now:  # the 101's head up to its accept value, made once a second
        _date_line[:] = [now, b"HTTP/1.1 101 Switching Protocols\r\n"
                         + f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n".encode()
                         + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: "]
    return [_date_line[1] + accept + b"\r\n\r\n"], [], True
