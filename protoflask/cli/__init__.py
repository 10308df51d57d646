"""The `protoflask` command.

Server side (serve.py): `serve` (flags generated from the configuration table; `--dev`
for a random secret and a ready token) and `token`. Client side (commands.py), on
protoflask.client: `ping`, `chat`, `call`, `tools`, `stats`. main.py holds the parser.

Exit codes: 0 success, 1 the server answered with an error (a tool failed, a run was
refused), 2 bad usage (flags, JSON, no token), 3 no session (unreachable server, refused
connection such as 401 INVALID_TOKEN, lost session), 130 interrupted.
"""

from .main import DESCRIPTION, EPILOG, build_parser, main
from .serve import DEV_HINTS
from .usage import (
    DEFAULT_URL, EXIT_CONNECTION, EXIT_INTERRUPTED, EXIT_SERVER_ERROR, EXIT_USAGE, UsageError,
)

__all__ = [
    "DEFAULT_URL", "DESCRIPTION", "DEV_HINTS", "EPILOG", "EXIT_CONNECTION", "EXIT_INTERRUPTED",
    "EXIT_SERVER_ERROR", "EXIT_USAGE", "UsageError", "build_parser", "main",
]
