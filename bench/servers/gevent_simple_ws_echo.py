"""Bare baseline: gevent's WSGI server + simple-websocket echo (no Flask).

    python bench/servers/gevent_simple_ws_echo.py --fd N | --port P

simple-websocket runs a reader "thread" per connection (a greenlet here, after
monkey-patching) that hands each message to the handler through a queue.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import socket  # noqa: E402

import simple_websocket  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402


def app(environ, start_response):
    ws = simple_websocket.Server.accept(environ)
    try:
        while True:
            ws.send(ws.receive())
    except simple_websocket.ConnectionClosed:
        pass
    return []


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
    parser.add_argument("--port", type=int, default=8091)
    WSGIServer(listener(parser.parse_args()), app, log=None, error_log=None).serve_forever()
