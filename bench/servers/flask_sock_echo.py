"""Bare baseline: Flask + flask-sock echo, as a Flask user would write it.

    gunicorn -c bench/servers/gunicorn_bench.conf.py --chdir bench/servers flask_sock_echo:app

Every text frame is sent back unchanged; any path works (the bench uses /proto/websocket).
"""

from flask import Flask
from flask_sock import Sock

app = Flask(__name__)
sock = Sock(app)


@sock.route("/proto/websocket")
def echo(ws):
    while True:
        ws.send(ws.receive())
