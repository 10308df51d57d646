"""Helpers for the hardening tests (security, fuzz, faults, overload, soak): raw HTTP
requests whose bytes are exactly what the test wrote, the endpoints of every transport, a
WebSocket upgrade by hand, and the server's /debug/vitals."""

from __future__ import annotations

import base64
import os
import socket
import struct
from typing import Any, Iterator

import orjson
import requests

from .support import HTTPResponseReader, StreamEnded, _host_port, timeout, wait_for

UPGRADE_HEADERS = {"Upgrade": "websocket", "Connection": "Upgrade",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                   "Sec-WebSocket-Version": "13"}


def envelope(type: str, channel: str = "SYSTEM", payload: dict | None = None,
             seq: int | str = 1, id: str | None = None) -> dict[str, Any]:
    return {"id": id or f"c{seq}", "session": "", "seq": str(seq), "ts": "1", "type": type,
            "channel": channel, "payload": payload if payload is not None else {}}


HELLO = envelope("HELLO", payload={"proto_version": "1.1.2", "accept_major": [1],
                                   "accept_events": []})


def connect(base_url: str) -> socket.socket:
    sock = socket.create_connection(_host_port(base_url), timeout=timeout(5))
    return sock


def raw_exchange(base_url: str, data: bytes, wait: float = 5.0) -> bytes:
    """Send raw bytes on a fresh connection; return what comes back until the server
    closes, a response is complete, or ``wait`` passes (then b"" or what was read)."""
    sock = connect(base_url)
    sock.settimeout(timeout(wait))
    try:
        sock.sendall(data)
        out = b""
        while True:
            try:
                piece = sock.recv(65536)
            except (TimeoutError, socket.timeout):
                return out
            except ConnectionResetError:
                return out
            if not piece:
                return out
            out += piece
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                length = _content_length(head)
                if length is not None and len(body) >= length:
                    return out
    finally:
        sock.close()


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return None


def status_of(response: bytes) -> int | None:
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def request(base_url: str, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request; the status, headers and body of its (final) response. A
    response that streams (200 on a live transport) is cut after its head."""
    host, port = _host_port(base_url)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    all_headers = dict(headers or {})
    if body is not None:
        all_headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in all_headers.items()]
    sock = connect(base_url)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        reader = HTTPResponseReader(sock)
        while b"\r\n\r\n" not in reader.buf:
            if not reader._fill():
                raise StreamEnded("connection closed before the response head")
        if reader.buf.startswith(b"HTTP/1.1 101"):  # not an interim answer here
            return 101, {}, b""
        status, resp_headers = reader.read_head()
        if status == 200 and "content-length" not in resp_headers:
            return status, resp_headers, b""  # a live stream
        try:
            data = reader.read_body()
        except StreamEnded:
            data = reader.buf
        return status, resp_headers, data
    finally:
        sock.close()


def error_code(body: bytes) -> str | None:
    try:
        return orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


#: Every endpoint that authenticates: name -> (method, path with {session}, body)
def endpoints(session: str = "nosuchsession") -> dict[str, tuple[str, str, bytes | None]]:
    hello = orjson.dumps(HELLO)
    return {
        "websocket": ("GET", "/proto/websocket", None),
        "sse": ("GET", "/proto/sse", None),
        "sse-post": ("POST", f"/proto/sse?session={session}", hello),
        "stream": ("POST", "/proto/stream", hello),
        "stream-post": ("POST", f"/proto/stream?session={session}", hello),
        "stream-resume": ("POST", f"/proto/stream?session={session}&last_seq=0", hello),
    }


def call_endpoint(base_url: str, name: str, token: str | None, session: str = "nosuchsession",
                  headers: dict[str, str] | None = None, query_token: bool = False
                  ) -> tuple[int, dict[str, str], bytes]:
    """An endpoint with a token where its clients put it: the query for the WebSocket and
    the SSE stream (or ``query_token``), the Authorization header otherwise."""
    method, path, body = endpoints(session)[name]
    all_headers = dict(UPGRADE_HEADERS) if name == "websocket" else {}
    all_headers.update(headers or {})
    if token is not None:
        if name in ("websocket", "sse") or query_token:
            path += ("&" if "?" in path else "?") + f"token={token}"
        else:
            all_headers["Authorization"] = f"Bearer {token}"
    return request(base_url, method, path, all_headers, body)


# -- WebSocket by hand -------------------------------------------------------------------


def ws_open(base_url: str, token: str, extra: str = "") -> socket.socket:
    """A WebSocket upgraded by hand; returns the socket after the 101 (or raises)."""
    sock = connect(base_url)
    host, port = _host_port(base_url)
    head = (f"GET /proto/websocket?token={token}{extra} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items()) + "\r\n")
    sock.sendall(head.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            raise AssertionError(f"no upgrade: {data!r}")
        data += piece
    assert data.startswith(b"HTTP/1.1 101"), data[:200]
    return sock


def ws_frame(payload: bytes, opcode: int = 1, fin: bool = True, mask: bytes | None = None,
             rsv: int = 0, length: int | None = None) -> bytes:
    """A client frame (masked unless mask=b''), with optional lies in its header."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    mask = os.urandom(4) if mask is None else mask
    bit = 0x80 if mask else 0
    if n < 126:
        header = struct.pack("!BB", first, bit | n)
    elif n < 65536:
        header = struct.pack("!BBH", first, bit | 126, n)
    else:
        header = struct.pack("!BBQ", first, bit | 127, n)
    if mask and mask != ZERO_MASK:  # the all-zero key changes no byte: nothing to undo
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + payload


#: a legal masking key that leaves the payload as it is (floods build frames fast with it)
ZERO_MASK = bytes(4)


def ws_hello(sock: socket.socket) -> None:
    sock.sendall(ws_frame(orjson.dumps(HELLO)))


def rst_close(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): a client killed, not one that said goodbye."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # wakes a thread of the client blocked reading it (which would otherwise keep the
        # socket open past close()), and sends nothing: the close then sends the RST
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


# -- the server's vitals -------------------------------------------------------------------


def vitals(base_url: str) -> dict[str, Any]:
    resp = requests.get(base_url + "/debug/vitals", timeout=timeout(10),
                        headers={"Connection": "close"})
    assert resp.status_code == 200, resp.text
    return resp.json()


def settled(base_url: str, baseline: dict[str, Any], *, sessions: int = 0,
            within: float = 15.0, slack: int = 0) -> dict[str, Any]:
    """Wait until the server holds no more running greenlets than at ``baseline`` (plus
    ``slack``), ``sessions`` sessions and no live connection; returns the last vitals."""
    last: dict[str, Any] = {}

    def calm() -> bool:
        last.update(vitals(base_url))
        return (last["activeConnections"] == 0 and last["sessions"] <= sessions
                and last["greenletsRunning"] <= baseline["greenletsRunning"] + slack)

    try:
        wait_for(calm, within=within, what="the server to settle")
    except AssertionError:
        raise AssertionError(f"server did not settle: {last} (baseline {baseline})") from None
    return last


def answers(base_url: str, token: str) -> None:
    """The server still answers /health and a PING on a new WebSocket."""
    from .support import WSClient

    assert requests.get(base_url + "/health", timeout=timeout(5)).status_code == 200
    client = WSClient(base_url, token)
    try:
        client.hello()
        client.send("PING", "SYSTEM", {"nonce": "still-alive"})
        client.recv_type("PONG", nonce="still-alive")
    finally:
        client.close()


def forged_token(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    return ".".join((b64(orjson.dumps(header)), b64(orjson.dumps(claims)), b64(signature)))



# -- servers of both kinds ----------------------------------------------------------------


def sleep_tool(params: dict[str, Any], *_: Any) -> dict[str, Any]:
    """tests/fixtures/hardening_app.py's ``sleep`` tool, for the embedded server."""
    import gevent

    gevent.sleep(params["seconds"])
    return {"slept": params["seconds"]}


SLEEP_SCHEMA = {"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0,
                                                             "maximum": 30}},
                "required": ["seconds"]}


class Live:
    """A running server of either kind, seen from outside (URL, tokens, vitals): the
    embedded ``ProtoServer.start()`` or gunicorn running tests/fixtures/hardening_app.py,
    both with /debug/vitals on and the ``sleep`` tool registered."""

    def __init__(self, kind: str, **config: Any) -> None:
        from protoflask import ProtoServer
        from protoflask.auth import TokenAuthority
        from protoflask.config import OPTIONS

        from .support import ROOT, SECRET, GunicornServer

        self.kind = kind
        config = {"debugVitals": True, "replayWindowTime": 1000, **config}
        if kind == "embedded":
            self.server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                                       "enableLogging": False, **config})
            self.server.register_tool(sleeping_tool())
            self.server.start()
            self.base_url = f"http://127.0.0.1:{self.server.port}"
        else:
            env_of = {o.key: o.env for o in OPTIONS}
            env = {env_of[k]: str(v).lower() if isinstance(v, bool) else str(v)
                   for k, v in config.items()}
            self.gunicorn = GunicornServer(env=env, app="hardening_app:app",
                                           chdir=ROOT / "tests" / "fixtures")
            self.base_url = self.gunicorn.base_url
        self.authority = TokenAuthority(SECRET)

    def token(self, user: str = "fuzz") -> str:
        return self.authority.issue(user)

    def stop(self) -> str:
        if self.kind == "embedded":
            self.server.stop()
            return ""
        return self.gunicorn.stop()


def live_with_baseline(kind: str, **config: Any) -> Iterator[Live]:
    """For module fixtures: a Live server known to answer, with its settled vitals as
    ``baseline`` (what each test's end state is compared with); stopped afterwards."""
    server = Live(kind, **config)
    try:
        answers(server.base_url, server.token())
        server.baseline = settled(server.base_url, vitals(server.base_url))  # type: ignore
        yield server
    finally:
        server.stop()


def sleeping_tool() -> Any:
    from protoflask import Tool

    return Tool("sleep", "Sleeps, then answers.", SLEEP_SCHEMA, execute=sleep_tool)
