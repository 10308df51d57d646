"""Test support: real servers on free ports and real protocol clients.

Deadlines, not sleeps: every wait has a timeout and fails the test when it passes.
Timeouts scale with PROTOFLASK_TEST_TIMEOUT_SCALE for slow machines.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import orjson
import redis
import requests
from websockets.sync.client import connect as ws_connect

ROOT = Path(__file__).resolve().parent.parent
SECRET = "test-secret-that-is-long-enough-for-hs256!"
SCALE = float(os.environ.get("PROTOFLASK_TEST_TIMEOUT_SCALE", "1"))


def timeout(seconds: float) -> float:
    return seconds * SCALE


def wait_for(predicate: Callable[[], Any], within: float = 5.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + timeout(within)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def built_js_client() -> Path:
    """clients/js compiled (tsc, into its dist/) for the tests that drive the TypeScript
    client from Node: CI builds it only after the suite (.ci/run's last step), so a fresh
    clone has no dist/ yet. Skips where node or npm is missing."""
    import pytest  # the suite's helpers are imported by bench/ too, which has no pytest

    client = ROOT / "clients" / "js"
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        pytest.skip("node/npm is not installed")
    if not (client / "node_modules" / "typescript").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=client,
                       check=True, capture_output=True, timeout=timeout(300))
    subprocess.run([npm, "exec", "--", "tsc", "-p", "tsconfig.json"], cwd=client, check=True,
                   capture_output=True, timeout=timeout(300))
    return client


def hello_payload(**overrides: Any) -> dict[str, Any]:
    payload = {"proto_version": "1.1.2", "accept_major": [1], "accept_events": []}
    payload.update(overrides)
    return payload


class Envelopes:
    """Builds client envelopes with a rising seq."""

    def __init__(self, start: int = 1) -> None:
        self._seq = itertools.count(start)
        self.last_seq = start - 1

    def make(self, type: str, channel: str = "USER", payload: dict | None = None,
             **fields: Any) -> dict[str, Any]:
        seq = next(self._seq)
        self.last_seq = seq
        env = {"id": f"c{seq}", "session": "", "seq": str(seq),
               "ts": str(int(time.time() * 1000)), "type": type, "channel": channel,
               "payload": payload if payload is not None else {}}
        env.update(fields)
        return env


class BaseClient:
    """What every transport's test client offers; tests are written against this."""

    transport = "base"
    session_id: str | None = None

    def __init__(self) -> None:
        self.envelopes = Envelopes()
        self.received: list[dict[str, Any]] = []

    # subclasses implement these three
    def send_raw(self, data: str | bytes) -> None:
        raise NotImplementedError

    def _recv_one(self, wait: float) -> dict[str, Any] | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        """Lose the connection abruptly (no close handshake, no end of request)."""
        raise NotImplementedError

    def send(self, type: str, channel: str = "USER", payload: dict | None = None,
             **fields: Any) -> dict[str, Any]:
        env = self.envelopes.make(type, channel, payload, **fields)
        self.send_raw(orjson.dumps(env).decode())
        return env

    def recv(self, within: float = 5.0) -> dict[str, Any]:
        msg = self._recv_one(timeout(within))
        if msg is None:
            raise AssertionError(f"{self.transport}: no message within {within}s")
        self.received.append(msg)
        return msg

    def recv_until(self, predicate: Callable[[dict[str, Any]], bool],
                   within: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout(within)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.transport}: expected message not received; got "
                                     f"{[m.get('type') for m in self.received[-10:]]}")
            msg = self._recv_one(left)
            if msg is None:
                continue
            self.received.append(msg)
            if predicate(msg):
                return msg

    def recv_type(self, type: str, within: float = 5.0, **payload: Any) -> dict[str, Any]:
        return self.recv_until(lambda m: m["type"] == type and all(
            m["payload"].get(k) == v for k, v in payload.items()), within)

    def expect_error(self, code: str, within: float = 5.0) -> dict[str, Any]:
        return self.recv_type("ERROR", within, code=code)

    def hello(self, **overrides: Any) -> dict[str, Any]:
        self.send("HELLO", "SYSTEM", hello_payload(**overrides))
        reply = self.recv_type("HELLO")
        self.session_id = reply["payload"]["session"]
        return reply

    def __enter__(self) -> "BaseClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class WSClient(BaseClient):
    transport = "websocket"

    def __init__(self, base_url: str, token: str | None, *, compression: bool = True,
                 headers: dict[str, str] | None = None, **query: Any) -> None:
        super().__init__()
        params = {k: v for k, v in {"token": token, **query}.items() if v is not None}
        qs = "&".join(f"{k}={v}" for k, v in params.items())
        url = base_url.replace("http://", "ws://") + "/proto/websocket" + (f"?{qs}" if qs else "")
        self._cm = ws_connect(url, compression="deflate" if compression else None,
                              additional_headers=headers, open_timeout=timeout(5),
                              max_size=None)
        self.ws = self._cm.__enter__()

    def send_raw(self, data: str | bytes) -> None:
        self.ws.send(data)

    def _recv_one(self, wait: float) -> dict[str, Any] | None:
        try:
            data = self.ws.recv(timeout=wait)
        except TimeoutError:
            return None
        return orjson.loads(data)

    def close(self) -> None:
        self.ws.close()

    def drop(self) -> None:
        """Lose the connection abruptly: no close handshake, as a network failure would."""
        import socket as _socket
        try:
            self.ws.socket.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        self.ws.close_socket()

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    def is_open(self) -> bool:
        """Whether the connection still stands (reads, and keeps, one message if any)."""
        try:
            msg = self.ws.recv(timeout=0.05)
        except TimeoutError:
            return True
        except Exception:  # noqa: BLE001 - closed, however it ended
            return False
        self.received.append(orjson.loads(msg))
        return True


def free_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class GunicornServer:
    """``gunicorn wsgi:app`` with the repository's gunicorn.conf.py in a subprocess, on a
    socket bound here (no race). ``app`` and ``chdir`` serve another WSGI app (the
    examples); ``args`` go on gunicorn's command line.

    Every one started and not yet stopped is in ``running``: tests/conftest.py stops what
    a test left behind (a test that failed between starting its nodes and its
    ``try``/``finally`` left gunicorn processes serving after the suite)."""

    running: "set[GunicornServer]" = set()

    def __init__(self, env: dict[str, str] | None = None, app: str = "wsgi:app",
                 chdir: Path = ROOT, args: Sequence[str] = ()) -> None:
        self.listener = free_listener()
        self.port = self.listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        fd = self.listener.fileno()
        full_env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
                    **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "--bind", f"fd://{fd}", "--chdir", str(chdir), *args, app],
            pass_fds=(fd,), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        GunicornServer.running.add(self)
        try:
            wait_for(self._healthy, within=20, what="gunicorn to answer /health")
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            out = self.proc.stdout.read().decode() if self.proc.stdout else ""
            raise AssertionError(f"gunicorn exited with {self.proc.returncode}:\n{out}")
        try:
            return requests.get(self.base_url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as a crashed machine would take it."""
        self.proc.kill()
        self._killed_output, _ = self.proc.communicate()
        self.listener.close()
        GunicornServer.running.discard(self)

    def stop(self) -> str:
        if hasattr(self, "_killed_output"):
            return self._killed_output.decode() if self._killed_output else ""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=timeout(15))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.listener.close()
        GunicornServer.running.discard(self)
        return out.decode() if out else ""


#: transport name -> test client class; every flow test runs once per entry.
CLIENTS: dict[str, type[BaseClient]] = {"websocket": WSClient}


# -- HTTP transports: raw-socket clients, so the wire is exactly what the server wrote --------


class HTTPRefused(Exception):
    """The server answered a connection request with an HTTP error (like websockets'
    InvalidStatus for the WebSocket client)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        super().__init__(f"HTTP {status}: {body[:200]!r}")

    def json(self) -> Any:
        return orjson.loads(self.body)


class StreamEnded(Exception):
    """The server ended the streaming response."""


_END = object()


class HTTPResponseReader:
    """One HTTP/1.1 response read from a socket: head, then body pieces as they arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.interim: list[int] = []  # 1xx statuses seen before the final one
        self.on_interim: Callable[[int], None] | None = None

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def read_head(self) -> tuple[int, dict[str, str]]:
        while True:
            while b"\r\n\r\n" not in self.buf:
                if not self._fill():
                    raise StreamEnded("connection closed before the response head")
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            if 100 <= status < 200:
                self.interim.append(status)
                if self.on_interim is not None:
                    self.on_interim(status)
                continue
            self.status = status
            self.headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                self.headers[name.strip().lower()] = value.strip()
            return status, self.headers

    def iter_body(self) -> Any:
        """Body bytes as they arrive; returns at the end of the body (or the connection)."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in self.buf:
                    if not self._fill():
                        raise StreamEnded("connection closed inside a chunked body")
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    if not self._fill():
                        raise StreamEnded("connection closed inside a chunk")
                data, self.buf = self.buf[:size], self.buf[size + 2:]
                if size == 0:
                    return
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while len(self.buf) < left:
                if not self._fill():
                    raise StreamEnded("connection closed inside the body")
            data, self.buf = self.buf[:left], self.buf[left:]
            if data:
                yield data
        else:
            while True:
                if self.buf:
                    data, self.buf = self.buf, b""
                    yield data
                if not self._fill():
                    return

    def read_body(self) -> bytes:
        return b"".join(self.iter_body())


def _host_port(base_url: str) -> tuple[str, int]:
    host, _, port = base_url.split("://", 1)[1].rstrip("/").partition(":")
    return host, int(port or 80)


def _query(params: dict[str, Any]) -> str:
    from urllib.parse import urlencode

    clean = {k: v for k, v in params.items() if v is not None}
    return ("?" + urlencode(clean)) if clean else ""


def open_http(base_url: str, method: str, path: str, headers: dict[str, str] | None = None,
              body: bytes | None = None, rcvbuf: int | None = None) -> socket.socket:
    """A socket with the request line and headers (and ``body``, if any) sent."""
    host, port = _host_port(base_url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:  # before connecting, so the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout(5))
    sock.connect((host, port))
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    all_headers = dict(headers or {})
    if body is not None:
        all_headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in all_headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    return sock


def read_until(sock: socket.socket, done: Callable[[bytes], bool] = lambda data: False
               ) -> bytes:
    """What the socket gives until ``done`` says it is enough (or the peer closes), then
    the socket closed."""
    data = b""
    try:
        while not done(data):
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    finally:
        sock.close()
    return data


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked request body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class _StreamingClient(BaseClient):
    """What the SSE and stream clients share: a reader thread feeding a queue."""

    def __init__(self) -> None:
        super().__init__()
        import queue
        import threading

        self._queue: "queue.Queue[Any]" = queue.Queue()
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.close_code: int | None = None
        self._thread: threading.Thread | None = None

    def _start(self, target: Callable[[], None]) -> None:
        import threading

        def run() -> None:
            try:
                target()
            except Exception as exc:  # kept for the test thread: recv raises it
                self.error = self.error or exc
            finally:
                self.ended.set()
                self._queue.put(_END)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def _recv_one(self, wait: float) -> dict[str, Any] | None:
        import queue

        try:
            item = self._queue.get(timeout=max(wait, 0))
        except queue.Empty:
            return None
        if item is _END:
            self._queue.put(_END)
            if isinstance(self.error, HTTPRefused):
                raise self.error
            raise StreamEnded(f"{self.transport}: the response ended ({self.error!r})")
        return item

    def wait_ended(self, within: float = 5.0) -> None:
        if not self.ended.wait(timeout(within)):
            raise AssertionError(f"{self.transport}: the response did not end")


class SSEClient(_StreamingClient):
    """GET /proto/sse read by a thread that parses the event stream; messages are POSTed."""

    transport = "sse"

    def __init__(self, base_url: str, token: str | None, *, compression: bool = True,
                 headers: dict[str, str] | None = None, **query: Any) -> None:
        super().__init__()
        self.base_url = base_url
        self.token = token
        self.events: list[dict[str, Any]] = []  # every event as parsed: event, id, data
        self.comments: list[str] = []
        self.posts: list[tuple[int, bytes]] = []  # (status, body) of every POST
        self._http = requests.Session()
        path = "/proto/sse" + _query({"token": token, **query})
        self.sock = open_http(base_url, "GET", path,
                              {"Accept": "text/event-stream", **(headers or {})})
        self.reader = HTTPResponseReader(self.sock)
        try:
            status, resp_headers = self.reader.read_head()
            if status != 200:
                raise HTTPRefused(status, resp_headers, self.reader.read_body())
            self.headers = resp_headers
            self._body = self.reader.iter_body()
            self._text = ""
            first = self._next_event()
            if first is None or first["event"] != "session":
                raise AssertionError(f"first SSE event is not the session event: {first}")
            self.session_id = orjson.loads(first["data"])["session"]
        except BaseException:
            _shutdown(self.sock)
            raise
        self.sock.settimeout(None)
        self._start(self._read_events)

    def _next_event(self) -> dict[str, Any] | None:
        """The next event (blank-line terminated) per the EventSource parsing rules."""
        event: dict[str, Any] = {"event": "message", "id": None, "data": None, "lines": []}
        while True:
            while "\n" not in self._text:
                try:
                    piece = next(self._body)
                except StopIteration:
                    return None
                self._text += piece.decode("utf-8")
            line, self._text = self._text.split("\n", 1)
            line = line.rstrip("\r")
            if line == "":
                if event["lines"]:
                    self.events.append(event)
                    return event
                continue
            event["lines"].append(line)
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                event["lines"].pop()
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                event["data"] = value if event["data"] is None else event["data"] + "\n" + value
            elif name in ("event", "id", "retry"):
                event[name] = value

    def _read_events(self) -> None:
        while True:
            event = self._next_event()
            if event is None:
                return
            if event["event"] == "message":
                self._queue.put(orjson.loads(event["data"]))
            elif event["event"] == "close":
                self.close_code = orjson.loads(event["data"])["code"]

    @property
    def last_event_id(self) -> str | None:
        ids = [e["id"] for e in self.events if e["id"] is not None]
        return ids[-1] if ids else None

    def post(self, body: bytes | str, headers: dict[str, str] | None = None,
             token: str | None = "default", session: str | None = "default") -> requests.Response:
        """POST /proto/sse?session=... with the client's (or the given) token."""
        token = self.token if token == "default" else token
        session = self.session_id if session == "default" else session
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        resp = self._http.post(self.base_url + "/proto/sse" + _query({"session": session}),
                               data=body, headers=all_headers, timeout=timeout(5))
        self.posts.append((resp.status_code, resp.content))
        return resp

    def send_raw(self, data: str | bytes) -> None:
        status = self.post(data).status_code
        # 400 (not JSON) and 413 (too large) are also reported on the stream, as ERRORs
        if status not in (202, 400, 413):
            raise AssertionError(f"POST /proto/sse answered {status}: {self.posts[-1][1]!r}")

    def close(self) -> None:
        _shutdown(self.sock)
        self._http.close()
        if self._thread is not None:
            self._thread.join(timeout(5))

    def drop(self) -> None:
        """Lose the event stream abruptly (the socket just goes)."""
        self.close()


class StreamClient(_StreamingClient):
    """POST /proto/stream with a chunked request body: full duplex on one raw socket.

    WSGI sends the response head with the first body bytes (for a new stream, the HELLO
    reply), so the request carries ``Expect: 100-continue``, as curl's chunked uploads do:
    the embedded server answers 100 as soon as the stream reads its body, and a refused
    connection (401, 404, 503) gets its final status at once, which the constructor raises.
    (gunicorn sends 100 before the application runs; there a refusal is raised by the first
    ``recv`` instead.)"""

    transport = "stream"

    def __init__(self, base_url: str, token: str | None, *, compression: bool = True,
                 headers: dict[str, str] | None = None, **query: Any) -> None:
        super().__init__()
        import threading

        self.base_url = base_url
        self.token = token
        self.lines: list[bytes] = []  # every response line as received
        self._head = threading.Event()
        self._answered = threading.Event()  # 100 Continue or the final status
        self._send_lock = threading.Lock()
        all_headers = {"Content-Type": "application/x-ndjson", "Transfer-Encoding": "chunked",
                       "Expect": "100-continue", **(headers or {})}
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        self.sock = open_http(base_url, "POST", "/proto/stream" + _query(query), all_headers)
        self.sock.settimeout(None)
        self.reader = HTTPResponseReader(self.sock)
        self.reader.on_interim = lambda status: self._answered.set()
        self._start(self._read_lines)
        if not self._answered.wait(timeout(5)):
            self.close()
            raise AssertionError("stream: neither 100 Continue nor a response")
        if isinstance(self.error, HTTPRefused):
            self.close()
            raise self.error

    def _read_lines(self) -> None:
        try:
            status, headers = self.reader.read_head()
            if status != 200:
                self.error = HTTPRefused(status, headers, self.reader.read_body())
                return
        finally:
            self._head.set()
            self._answered.set()
        self.session_id = headers.get("proto-session")
        pending = b""
        for piece in self.reader.iter_body():
            pending += piece
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                self.lines.append(line)
                self._queue.put(orjson.loads(line))
        assert not pending, f"response ended inside a line: {pending[:100]!r}"

    def response_head(self, within: float = 5.0) -> tuple[int, dict[str, str]]:
        if not self._head.wait(timeout(within)):
            raise AssertionError("no response head")
        if isinstance(self.error, HTTPRefused):
            raise self.error
        return self.reader.status, self.reader.headers

    def send_chunk(self, data: bytes) -> None:
        """Raw bytes as one chunk of the request body (need not be whole lines)."""
        with self._send_lock:
            self.sock.sendall(chunk(data))

    def end_body(self) -> None:
        with self._send_lock:
            self.sock.sendall(b"0\r\n\r\n")

    def send_raw(self, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.send_chunk(raw if raw.endswith(b"\n") else raw + b"\n")

    def close(self) -> None:
        _shutdown(self.sock)
        if self._thread is not None:
            self._thread.join(timeout(5))

    def drop(self) -> None:
        """Lose the connection abruptly: no end of the request body."""
        self.close()


CLIENTS["sse"] = SSEClient
CLIENTS["stream"] = StreamClient


class PrivateRedis:
    """A redis-server of its own on a free port, for a test or bench that kills, flushes or
    restarts it (never the shared one)."""

    def __init__(self, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("needs redis-server on PATH (.ci/run installs it)")
        self.binary = binary
        listener = free_listener()
        self.port = listener.getsockname()[1]
        listener.close()
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *auth], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_for(self._answers, what="the private redis-server")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def hanging_tool(server: Any, name: str = "slow") -> threading.Event:
    """Give ``server`` a tool that runs 60 s (it ends by being cancelled); the event is
    set once a call of it has started."""
    started = threading.Event()

    @server.tool(name, input_schema={"type": "object"})
    def hang(params: dict[str, Any], *context: Any) -> dict[str, Any]:
        import gevent
        started.set()
        gevent.sleep(60)
        return {}

    return started


def hold_over_budget(server: Any, user: str, budget: int = 100_000) -> tuple[str, WSClient]:
    """``user`` over the memory budget: a WebSocket session of theirs holds an open text of
    ~200 KB, then maxUserBytes is set to ``budget`` under it, with the budget's review off
    (it would close the session and give the bytes back). Returns the user's token and the
    session's client, for the caller to close."""
    server.engine.budget.review = lambda sessions: None
    token = server.issue_token(user)
    client = WSClient(server.base_url, token)
    try:
        client.hello()
        client.send("MESSAGE_START", payload={"message_id": "t1",
                                              "content_type": "text/plain"})
        client.send("MESSAGE_PART", payload={"message_id": "t1", "content": "x" * 200_000})
        client.send("PING", "SYSTEM", {"nonce": "held"})
        client.recv_type("PONG", nonce="held")  # the open text is held now
    except BaseException:
        client.close()
        raise
    server.engine.budget.user_budget = budget
    return token, client
