"""How long a caught-up stream resume takes to answer its status line and headers.

    python bench/resume_head.py [--server embedded|gunicorn] [--resumes 50] [--give-up 3]

A session is opened (POST /proto/stream with the HELLO as its body) and left; then
``--resumes`` times: ``POST /proto/stream?session=<id>&last_seq=<last>`` with a chunked
body of which nothing is written, and the time from sending the request head to reading
the response head. The window holds nothing newer than ``last_seq``, so no message can
carry the head. Heartbeats are off (10 min) so no PING carries it by chance. A resume
whose head has not come within ``--give-up`` seconds counts as "no head". Prints one
JSON line: p50/p99/max ms and how many got no head.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SECRET = "bench-secret-that-is-long-enough-for-hs256!"
QUIET = {"HEARTBEAT_INTERVAL": "600000", "HEARTBEAT_TIMEOUT": "600000"}


def request_head(port: int, path: str, token: str, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\n{extra}\r\n").encode()


def open_session(port: int, token: str) -> tuple[str, int, socket.socket]:
    hello = json.dumps({"id": "b1", "session": "", "seq": "1", "ts": "0", "type": "HELLO",
                        "channel": "SYSTEM", "payload": {"proto_version": "1.1.2",
                                                         "accept_major": [1],
                                                         "accept_events": []}}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(request_head(port, "/proto/stream", token,
                              f"Content-Length: {len(hello)}\r\n") + hello)
    buf = b""
    while b'"type":"HELLO"' not in buf or not buf.rstrip().endswith(b"}"):
        buf += sock.recv(65536)
    sid = next(line.split(b":", 1)[1].strip().decode() for line in buf.split(b"\r\n")
               if line.lower().startswith(b"proto-session:"))
    return sid, 1, sock


def time_to_head(port: int, token: str, sid: str, last: int, give_up: float) -> float | None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(give_up)
    try:
        start = time.perf_counter()
        sock.sendall(request_head(port, f"/proto/stream?session={sid}&last_seq={last}", token,
                                  "Transfer-Encoding: chunked\r\n"))
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return None
            buf += data
        elapsed = time.perf_counter() - start
        assert buf.startswith(b"HTTP/1.1 200"), buf[:100]
        return elapsed
    except socket.timeout:
        return None
    finally:
        sock.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=("embedded", "gunicorn"), default="embedded")
    p.add_argument("--resumes", type=int, default=50)
    p.add_argument("--give-up", type=float, default=3.0)
    args = p.parse_args()

    from protoflask.auth import TokenAuthority

    token = TokenAuthority(SECRET).issue("bench-resume")
    proc = None
    if args.server == "embedded":
        from protoflask import ProtoServer

        server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": SECRET,
                              "enableLogging": False, "heartbeatInterval": 600000,
                              "heartbeatTimeout": 600000})
        server.start()
        port = server.port
    else:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"),
             "--bind", f"fd://{listener.fileno()}", "--chdir", str(ROOT), "wsgi:app"],
            pass_fds=(listener.fileno(),), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "JWT_SECRET": SECRET, "ENABLE_LOGGING": "false", **QUIET})
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    try:
        sid, last, first = open_session(port, token)
        first.close()
        times = [time_to_head(port, token, sid, last, args.give_up)
                 for _ in range(args.resumes)]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(15)
        else:
            server.stop()
    got = sorted(t * 1000 for t in times if t is not None)
    result = {"server": args.server, "resumes": args.resumes,
              "no_head": sum(1 for t in times if t is None), "give_up_s": args.give_up}
    if got:
        result.update(p50_ms=round(statistics.median(got), 2),
                      p99_ms=round(got[min(len(got) - 1, int(len(got) * 0.99))], 2),
                      max_ms=round(got[-1], 2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
