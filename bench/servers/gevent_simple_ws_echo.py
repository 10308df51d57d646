"""Bare baseline: gevent's WSGI server + simple-websocket echo (no Flask).

    python bench/servers/gevent_simple_ws_echo.py --fd N | --port P

simple-websocket runs a reader "thread" per connection (a greenlet here, after
monkey-patching) that hands each message to the handler through a queue.
"""

from gevent import monkey

monkey.patch_all()


import simple_websocket  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402

from _listener import listener  # noqa: E402


def app(environ, start_response):
    ws = simple_websocket.Server.accept(environ)
    try:
        while True:
            ws.send(ws.receive())
    except simple_websocket.ConnectionClosed:
        pass
    return []


if __name__ == "__main__":
    WSGIServer(listener(8091), app, log=None, error_log=None).serve_forever()
