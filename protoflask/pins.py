"""The third-party internals protoflask's fast paths rely on, checked when the module that
relies on them is imported: a release of ``websockets``, redis-py or Flask that renamed
one fails at start-up with the name and the reason, not in the middle of a connection.

Each check names what it reads beyond the library's documented API and who reads it:

- ``websockets`` (transports/websocket.py reads its frames itself on a connection without
  extensions and writes around the protocol object): ``ServerProtocol``'s ``writes``,
  ``parser_exc``, ``current_size``, ``max_message_size`` and ``extensions``, and the C
  ``apply_mask`` when built. pyproject.toml bounds the versions to those tested.
- redis-py (cluster/redis_client.py's short way for the journal's one command):
  ``Connection._connect`` (overridden for gevent's sockets), ``Connection._sock`` and
  ``Connection._parser.parse_error``.
- Flask (post_lane.py answers the session POSTs without Flask's cycle while the app has
  no hooks of its own): the hook tables ``before_request_funcs``, ``after_request_funcs``,
  ``teardown_request_funcs``, ``url_value_preprocessors`` and
  ``teardown_appcontext_funcs``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any, Iterable

__all__ = ["InternalsMissing", "check_blinker", "check_flask", "check_redis",
           "check_websockets", "require"]


class InternalsMissing(ImportError):
    """A library lacks an internal a protoflask fast path reads."""


def _installed(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "(version unknown)"


def require(distribution: str, obj: Any, names: Iterable[str], reader: str) -> None:
    """Raise InternalsMissing unless ``obj`` has every attribute in ``names``."""
    missing = [name for name in names if not hasattr(obj, name)]
    if missing:
        raise InternalsMissing(
            f"protoflask: {distribution} {_installed(distribution)} has no "
            f"{', '.join(missing)} on {type(obj).__name__}, which {reader} reads; install "
            f"the {distribution} versions pyproject.toml allows (protoflask/pins.py)")


def check_websockets() -> None:
    from websockets.protocol import State
    from websockets.server import ServerProtocol

    protocol = ServerProtocol(state=State.OPEN, max_size=1024)
    require("websockets", protocol,
            ("writes", "parser_exc", "current_size", "max_message_size", "extensions"),
            "transports/websocket.py's frame reader and writer")
    if not (isinstance(protocol.writes, list) and protocol.parser_exc is None
            and protocol.current_size is None and protocol.max_message_size == 1024):
        raise InternalsMissing(
            f"protoflask: websockets {_installed('websockets')} keeps ServerProtocol's "
            "writes, parser_exc, current_size or max_message_size in another form than "
            "transports/websocket.py reads (protoflask/pins.py)")


def check_redis() -> None:
    import redis.connection

    connection = redis.connection.Connection()  # (connects on first use only)
    require("redis", connection, ("_connect", "_sock", "_parser"),
            "cluster/redis_client.py's GeventConnection")
    require("redis", connection._parser, ("parse_error",),
            "cluster/redis_client.py's GeventConnection.execute_packed")


def check_flask() -> None:
    from flask import Flask

    app = Flask("protoflask.pins")
    names = ("before_request_funcs", "after_request_funcs", "teardown_request_funcs",
             "url_value_preprocessors", "teardown_appcontext_funcs")
    require("flask", app, names, "post_lane.py's check that the app has no hooks of its own")
    if not all(isinstance(getattr(app, name), (dict, list)) for name in names):
        raise InternalsMissing(
            f"protoflask: flask {_installed('flask')} keeps its hook tables in another "
            "form than post_lane.py reads (protoflask/pins.py)")


def check_gevent_socket() -> None:
    import gevent.socket

    # on the class: its slots and methods (an instance would be a descriptor of its own)
    require("gevent", gevent.socket.socket, ("_io_refs", "_decref_socketios", "_closed"),
            "transports/sockets.py's hold_open")
    require("gevent", gevent.socket.socket, ("_read_event",),
            "transports/sockets.py's PeerWatch (the socket's own read watcher)")


def check_blinker() -> None:
    from blinker import Signal

    signal = Signal()
    require("blinker", signal, ("_by_sender", "_disconnect", "receivers"),
            "signals.py's walk of a signal's receivers")
    from blinker import base, _utilities

    require("blinker", base, ("ANY_ID",), "signals.py's walk of a signal's receivers")
    require("blinker", _utilities, ("make_id",), "signals.py's walk of a signal's receivers")
