"""Bare ceiling: gevent StreamServer + the `websockets` sans-I/O ServerProtocol echo.

    python bench/servers/gevent_sansio_echo.py --fd N | --port P

No WSGI, no Flask: one greenlet per connection parses frames with
``receive_data`` / ``events_received`` and writes ``data_to_send`` itself. This is the
fastest Python echo in docs/PERFORMANCE.md ("Earlier"); the bench uses it to show that the
load generator is not what limits the other servers.
"""

from gevent import monkey

monkey.patch_all()


import socket  # noqa: E402

from gevent.server import StreamServer  # noqa: E402
from websockets.frames import Opcode  # noqa: E402
from websockets.http11 import Request  # noqa: E402
from websockets.protocol import State  # noqa: E402
from websockets.server import ServerProtocol  # noqa: E402

from _listener import listener  # noqa: E402


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


if __name__ == "__main__":
    StreamServer(listener(8092), handle).serve_forever()
