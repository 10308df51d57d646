"""The sans-I/O protocol core: plain data in, plain data out.

Nothing here imports Flask, gevent or sockets, and nothing reads the clock:
callers pass the time in milliseconds.
"""

from . import errors, messages
from .calls import Run
from .credits import CreditLedger, CreditSettings
from .envelope import Message, parse
from .errors import ProtoError
from .replay import ReplayWindow
from .session import ProtocolSession
from .settings import SessionSettings

__all__ = [
    "CreditLedger", "CreditSettings", "Message", "ProtoError", "ProtocolSession",
    "ReplayWindow", "Run", "SessionSettings", "errors", "messages", "parse",
]
