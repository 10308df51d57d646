"""The wire format's names and bounds (docs/PROTOCOL.md §2, §4, §5): channels, the sets of
message types, and the limits on seqs, ts and nesting with the patterns that check them.

Shared by the schemas (schemas.py) and the fast checks and parsing (envelope.py).
"""

from __future__ import annotations

import re

CHANNELS = ("SYSTEM", "USER", "AGENT", "AUDIO_IN", "AUDIO_OUT")

#: Types that never need or spend credit and are allowed on any channel (docs/PROTOCOL.md §5).
CONTROL_TYPES = frozenset({
    "HELLO", "PING", "PONG", "ACK", "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL",
    "REPLAY_REQUEST", "ERROR",
})

#: Every type name a client may send.
CLIENT_TYPES = frozenset({
    "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_CALL",
    "TOOL_CANCEL", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "RUN_CANCEL", "ACK",
    "FLOW_UPDATE", "PAUSE_CHANNEL", "RESUME_CHANNEL", "REPLAY_REQUEST", "AUDIO_CHUNK",
})

#: Every type name the server sends.
SERVER_TYPES = frozenset({
    "HELLO", "PING", "PONG", "MESSAGE_START", "MESSAGE_PART", "MESSAGE_END", "TOOL_UPDATE",
    "TOOL_DONE", "TOOL_LIST", "RUN_STARTED", "RUN_FINISHED", "FLOW_UPDATE", "PAUSE_CHANNEL",
    "RESUME_CHANNEL", "ERROR", "AUDIO_CHUNK",
})

#: Longest decimal string accepted for a ts. Python refuses to convert strings of
#: more than 4300 digits (a ValueError no schema expects), and no clock needs more than 20.
MAX_DIGITS = 64
#: Largest seq anywhere (the envelope's, every payload seq field, the last_seq query):
#: 2^53-1, exact in a JavaScript number and storable as an int64 by every layer (orjson,
#: Redis, the dashboard). INVALID_MESSAGE beyond.
MAX_SEQ = 2 ** 53 - 1
SEQ_DIGITS = len(str(MAX_SEQ))  # 16
#: Validation reports at most this many errors per list (then stops looking): a payload
#: with 250k bad elements costs five checks and a small ERROR, not 250k of each.
MAX_VALIDATION_ERRORS = 5
#: Deepest JSON nesting accepted in an envelope (the envelope object is level 1, its
#: payload level 2). orjson itself refuses more than 1024 levels on reading and encodes
#: at most 254, so anything a client nests is cut well before either (maxJsonDepth).
MAX_JSON_DEPTH = 64

POSITIVE_INT = re.compile(r"[1-9][0-9]{0,%d}\Z" % (SEQ_DIGITS - 1), re.ASCII)
NON_NEGATIVE_INT = re.compile(r"(0|[1-9][0-9]{0,%d})\Z" % (SEQ_DIGITS - 1), re.ASCII)
SEQ_ERROR = f"must be a decimal string of a number of at most {MAX_SEQ} (2^53-1)"
DECIMAL = re.compile(r"[0-9]{1,%d}\Z" % MAX_DIGITS, re.ASCII)
VERSION = re.compile(r"\d+\.\d+\.\d+\Z")

#: The longest PING / PONG nonce, in characters. The server's own are 19; a longer one
#: would only make the server decode, encode and compress it again into the PONG (a
#: 1 MB nonce deflates to 1 kB on the way in), so it is refused (INVALID_MESSAGE).
MAX_NONCE_LENGTH = 256
