"""The head lane (protoflask/head_lane.py) answers byte for byte as gunicorn's parser does:
the same request bytes sent to protoflask's gunicorn worker with the lane and without it
(tests/fixtures/head_lane_workers.py), on every case the lane takes and every one it
leaves; the lane took the ones it should; a refusal is counted and a ticket spent once."""

from __future__ import annotations

import itertools
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

from ..support import SECRET, GunicornServer, read_until, timeout, wait_for

from protoflask.auth import TokenAuthority

KEY = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
HELLO = (b'{"id":"c1","session":"","seq":"1","ts":"0","type":"HELLO","channel":"SYSTEM",'
         b'"payload":{"proto_version":"1.1.2","accept_major":[1],"accept_events":[]}}\n')
ORIGIN = "http://page.example"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    where = tmp_path_factory.mktemp("head_lane")
    log = where / "taken"
    env = {"ALLOWED_ORIGINS": ORIGIN, "HEAD_LANE_LOG": str(log)}
    workers = "tests.fixtures.head_lane_workers."
    access = {name: where / f"{name}.access" for name in ("lane", "plain")}
    lane = GunicornServer(env, args=("-k", workers + "CountingHeadWorker",
                                     "--access-logfile", str(access["lane"])))
    try:
        plain = GunicornServer(env, args=("-k", workers + "PlainHeadWorker",
                                          "--access-logfile", str(access["plain"])))
    except BaseException:
        lane.stop()
        raise
    try:  # the lane without an access log: a stream's environ only what it reads
        quiet = GunicornServer({**env, "HEAD_LANE_LOG": str(where / "quiet-taken")},
                               args=("-k", workers + "CountingHeadWorker"))
    except BaseException:
        lane.stop()
        plain.stop()
        raise
    try:
        yield {"lane": lane, "plain": plain, "quiet": quiet, "log": log,
               "quiet-log": where / "quiet-taken", "access": access}
    finally:
        lane.stop()
        plain.stop()
        quiet.stop()


def token(user: str = "alice") -> str:
    return TokenAuthority(SECRET).issue(user)


def exchange(server: GunicornServer, request: bytes, done: Callable[[bytes], bool]) -> bytes:
    """Send ``request`` as it is, read until ``done`` (or the close), made comparable: the
    Date, session ids, timestamps and chunk sizes replaced."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout(5))
    sock.sendall(request)
    data = read_until(sock, done)
    data = re.sub(rb"\r\nDate: [^\r]*", b"", data)
    data = re.sub(rb'"ts":"\d+"', b'"ts":"-"', data)
    data = re.sub(rb"\r\n[0-9a-f]+\r\n(?=[{e:])", b"\r\n<chunk>\r\n", data)
    return re.sub(rb"[0-9a-f]{32}", b"<session>", data)


def whole(data: bytes) -> bool:
    """A head and, when it names a length, that much body; or a stream's first event/line."""
    data = data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    if b" 101 " in head.split(b"\r\n")[0]:
        return True
    length = re.search(rb"Content-Length: (\d+)", head)
    if length is not None:
        return len(body) >= int(length.group(1))
    return body.endswith((b"\n\r\n", b"\n\n"))  # a stream's first event or line


def both(servers: dict[str, Any], request: bytes) -> tuple[bytes, bytes, list[str]]:
    log: Path = servers["log"]
    before = log.read_text().split() if log.exists() else []
    lane = exchange(servers["lane"], request, whole)
    plain = exchange(servers["plain"], request, whole)
    after = log.read_text().split() if log.exists() else []
    return lane, plain, after[len(before):]


def upgrade(query: str, extra: str = "", version: str = "HTTP/1.1") -> bytes:
    return (f"GET /proto/websocket{query} {version}\r\nHost: 127.0.0.1\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\n{KEY}{extra}\r\n").encode()


def sse(query: str, extra: str = "") -> bytes:
    return (f"GET /proto/sse{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Accept: text/event-stream\r\n{extra}\r\n").encode()


def stream(query: str, extra: str = "", body: bytes = HELLO) -> bytes:
    return (f"POST /proto/stream{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/x-ndjson\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


BEARER = "Authorization: Bearer {token}\r\n"
#: case -> (request, what the lane does with it: its log line, or None: left to gunicorn)
CASES: dict[str, tuple[Callable[[], bytes], str | None]] = {
    "upgrade": (lambda: upgrade(f"?token={token()}"), "upgrade"),
    "upgrade, Bearer": (lambda: upgrade("", BEARER.format(token=token())), "upgrade"),
    "upgrade, its Origin allowed": (lambda: upgrade(f"?token={token()}", f"Origin: {ORIGIN}\r\n"),
                                    "upgrade"),
    "upgrade, an Origin refused": (lambda: upgrade(f"?token={token()}",
                                                   "Origin: http://evil.example\r\n"), None),
    "upgrade, no token": (lambda: upgrade(""), None),
    "upgrade, a bad token": (lambda: upgrade("?token=nope"), None),
    "upgrade, an unknown session": (lambda: upgrade(f"?token={token()}&session={'f' * 32}"
                                                    "&last_seq=0"), None),
    "upgrade, a bad last_seq": (lambda: upgrade(f"?token={token()}&session=s&last_seq=x1"),
                                None),
    # admitted, then refused by the handshake in the connection's greenlet, as the route's
    "upgrade, no key": (lambda: upgrade(f"?token={token()}").replace(b"Sec-WebSocket-Key", b"X"),
                        "upgrade"),
    "upgrade, HTTP/1.0": (lambda: upgrade(f"?token={token()}", version="HTTP/1.0"), None),
    "upgrade, pipelined": (lambda: upgrade(f"?token={token()}") + b"GET /health HTTP/1.1\r\n\r\n",
                           None),
    "upgrade, an underscore header": (lambda: upgrade(f"?token={token()}", "X_A: 1\r\n"), None),
    "upgrade, a repeated Host": (lambda: upgrade(f"?token={token()}", "Host: other\r\n"), None),
    "upgrade, obsolete folding": (lambda: upgrade(f"?token={token()}", "X-A: 1\r\n 2\r\n"), None),
    "upgrade, a bare LF": (lambda: upgrade(f"?token={token()}", "X-A: 1\n"), None),
    "upgrade, a control byte": (lambda: upgrade(f"?token={token()}", "X-A: \x01\r\n"), None),
    "upgrade, a URI too long": (lambda: upgrade("?token=" + "t" * 5000), None),
    "upgrade, a field too long": (lambda: upgrade("", "X-A: " + "v" * 9000 + "\r\n"), None),
    "sse": (lambda: sse(f"?token={token()}"), "/proto/sse"),
    "sse, its Origin allowed": (lambda: sse(f"?token={token()}", f"Origin: {ORIGIN}\r\n"),
                                "/proto/sse"),
    "sse, no token": (lambda: sse(""), None),
    "sse, a bad Last-Event-ID": (lambda: sse(f"?token={token()}", "Last-Event-ID: x\r\n"),
                                 None),
    "sse, an unknown session": (lambda: sse(f"?token={token()}&session={'f' * 32}&last_seq=0"),
                                None),
    "sse, Connection: close": (lambda: sse(f"?token={token()}", "Connection: close\r\n"),
                               "/proto/sse"),
    "sse, HTTP/1.0": (lambda: sse(f"?token={token()}").replace(b"HTTP/1.1", b"HTTP/1.0"), None),
    "stream": (lambda: stream("", BEARER.format(token=token())), "/proto/stream"),
    "stream, no token": (lambda: stream(""), None),
    "stream, an unknown session resumed": (lambda: stream(
        f"?session={'f' * 32}&last_seq=0", BEARER.format(token=token())), None),
    "stream, a session's POST batch": (lambda: stream(
        f"?session={'f' * 32}", BEARER.format(token=token())), None),
    "stream, not JSON": (lambda: stream("", BEARER.format(token=token()), b"nope\n"),
                         "/proto/stream"),
    "stream, a body over the lane's": (lambda: stream("", BEARER.format(token=token()),
                                                      HELLO + b" " * 5000), None),
    "stream, Expect": (lambda: stream("", BEARER.format(token=token())
                                      + "Expect: 100-continue\r\n"), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_lane_answers_byte_for_byte_as_gunicorn(servers: dict[str, Any], case: str) -> None:
    make, taken = CASES[case]
    lane, plain, log = both(servers, make())
    assert lane == plain
    assert lane.startswith(b"HTTP/1."), lane
    assert log == ([taken] if taken else []), log


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("sse", "stream"))])
def test_without_an_access_log_the_lane_answers_as_gunicorn(servers: dict[str, Any],
                                                            case: str) -> None:
    """The lane with gunicorn's access log off (``HeadLane.open(whole=False)``: the lean
    environ, ``HeadLane.lean_open``): the same bytes as gunicorn's path."""
    make, taken = CASES[case]
    log: Path = servers["quiet-log"]
    before = log.read_text().split() if log.exists() else []
    request = make()
    quiet = exchange(servers["quiet"], request, whole)
    plain = exchange(servers["plain"], request, whole)
    after = log.read_text().split() if log.exists() else []
    assert quiet == plain
    assert quiet.startswith(b"HTTP/1."), quiet
    assert after[len(before):] == ([taken] if taken else [])


def refusals(server: GunicornServer) -> float:
    text = requests.get(server.base_url + "/metrics", timeout=timeout(5)).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("protoflask_connections_refused_total{"))


@pytest.mark.parametrize("request_", [upgrade("?token=nope"), sse("?token=nope"),
                                      stream("", "Authorization: Bearer nope\r\n")],
                         ids=["upgrade", "sse", "stream"])
def test_a_refusal_is_counted_once(servers: dict[str, Any], request_: bytes) -> None:
    for name in ("lane", "plain"):
        before = refusals(servers[name])
        exchange(servers[name], request_, whole)
        assert refusals(servers[name]) - before == 1, name


def ticket(server: GunicornServer) -> str:
    answer = requests.post(server.base_url + "/proto/ticket", timeout=timeout(5),
                           headers={"Authorization": f"Bearer {token()}"})
    return str(answer.json()["ticket"])


def test_a_ticket_is_spent_once_by_a_refused_upgrade(servers: dict[str, Any]) -> None:
    """The lane's admission spends the ticket and is refused (an unknown session); gunicorn's
    reading of the same request answers that refusal, not "ticket already used"."""
    answers = []
    for name in ("lane", "plain"):
        query = f"?ticket={ticket(servers[name])}&session={'f' * 32}&last_seq=0"
        answers.append(exchange(servers[name], upgrade(query), whole))
    assert answers[0] == answers[1]
    assert b"SESSION_NOT_FOUND" in answers[0] or b"404" in answers[0].split(b"\r\n")[0], \
        answers[0]


def access_line(servers: dict[str, Any], name: str, probe: str) -> str | None:
    """The access line of the request marked ``probe`` (a key of its query), if written."""
    path: Path = servers["access"][name]
    lines = path.read_text().splitlines() if path.exists() else []
    return next((line for line in lines if probe in line), None)


@pytest.mark.parametrize("case", ["sse", "sse refused", "stream"])
def test_gunicorns_access_line_is_the_same_and_keeps_no_token(servers: dict[str, Any],
                                                              case: str) -> None:
    """The stream's access line (written when it ends) as gunicorn's path writes it, the
    token redacted (gunicorn_worker.RedactingLogger)."""
    lines = {}
    for name in ("lane", "plain"):
        probe = f"probe{os.getpid()}x{next(PROBES)}"
        # a key: the logger redacts every value in a query (logs.redacted_query)
        request_ = {"sse": sse(f"?token={token()}&{probe}=1"),
                    "sse refused": sse(f"?token=nope&{probe}=1"),
                    "stream": stream(f"?{probe}=1", BEARER.format(token=token()))}[case]
        exchange(servers[name], request_, whole)  # then closed: the stream ends
        line = wait_for(lambda name=name, probe=probe: access_line(servers, name, probe),
                        within=10, what=f"{name}'s access line")
        line = line.replace(probe, "<probe>")
        lines[name] = re.sub(r"\[\d\d/[^]]*\]", "[<time>]", line)
    assert lines["lane"] == lines["plain"]
    assert "nope" not in lines["lane"] and token() not in lines["lane"], lines["lane"]
    if case.startswith("sse"):
        assert "?token=[redacted]&<probe>=[redacted] " in lines["lane"], lines["lane"]


PROBES = itertools.count()


def test_a_head_in_two_pieces_is_left_to_gunicorn_and_served(servers: dict[str, Any]) -> None:
    """The lane's peek sees half a head: gunicorn reads it whole (within what is left of
    its keep-alive timeout) and the upgrade is served as ever."""
    answers = []
    log: Path = servers["log"]
    taken = len(log.read_text().split()) if log.exists() else 0
    for name in ("lane", "plain"):
        request_ = upgrade(f"?token={token()}")
        sock = socket.create_connection(("127.0.0.1", servers[name].port), timeout=timeout(5))
        sock.sendall(request_[:40])
        time.sleep(0.2)  # the lane's peek has had the first piece alone
        sock.sendall(request_[40:])
        answers.append(re.sub(rb"\r\nDate: [^\r]*", b"", read_until(sock, whole)))
    assert answers[0] == answers[1]
    assert answers[0].startswith(b"HTTP/1.1 101 "), answers[0]
    assert len(log.read_text().split()) == taken, "the lane took half a head"
