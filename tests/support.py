"""Test support: real servers on free ports and real protocol clients.

Deadlines, not sleeps: every wait has a timeout and fails the test when it passes.
Timeouts scale with PROTOFLASK_TEST_TIMEOUT_SCALE for slow machines.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson
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

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code


def free_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class GunicornServer:
    """``gunicorn -k gevent wsgi:app`` in a subprocess, on a socket bound here (no race)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.listener = free_listener()
        self.port = self.listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        fd = self.listener.fileno()
        full_env = {**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false",
                    **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "--bind", f"fd://{fd}", "--chdir", str(ROOT), "wsgi:app"],
            pass_fds=(fd,), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=timeout(15))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.listener.close()
        return out.decode() if out else ""


#: transport name -> test client class; every flow test runs once per entry.
CLIENTS: dict[str, type[BaseClient]] = {"websocket": WSClient}
