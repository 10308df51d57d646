"""Bare ceiling: gevent StreamServer + the `websockets` sans-I/O ServerProtocol echo.

    python bench/servers/gevent_sansio_echo.py --fd N | --port P

No WSGI, no Flask: one greenlet per connection parses frames with
``receive_data`` / ``events_received`` and writes ``data_to_send`` itself. This is the
fastest Python echo in /work/shared/PERF-NOTES.md; the bench uses it to show that the
load generator is not what limits the other servers.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import socket  # noqa: E402

from gevent.server import StreamServer  # noqa: E402
from websockets.frames import Opcode  # noqa: E402
from websockets.http11 import Request  # noqa: E402
from websockets.protocol import State  # noqa: E402
from websockets.server import ServerProtocol  # noqa: E402


def handle(sock: socket.socket, _addr) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = ServerProtocol(max_size=None)
    try:
        while proto.state is not State.CLOSED:
            data = sock.recv(65536)
            if data:
                proto.receive_data(data)
            else:
                proto.receive_eof()
            for event in proto.events_received():
                if isinstance(event, Request):
                    proto.send_response(proto.accept(event))
                elif event.opcode is Opcode.TEXT:
                    proto.send_text(event.data)
            out = proto.data_to_send()
            if out:
                sock.sendall(b"".join(out))
            if not data:
                break
    except OSError:
        pass
    finally:
        sock.close()


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
    parser.add_argument("--port", type=int, default=8092)
    StreamServer(listener(parser.parse_args()), handle).serve_forever()
