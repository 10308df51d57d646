"""What every `protoflask` command shares: exit codes, the default URL, bad usage."""

from __future__ import annotations

EXIT_SERVER_ERROR, EXIT_USAGE, EXIT_CONNECTION, EXIT_INTERRUPTED = 1, 2, 3, 130
DEFAULT_URL = "http://127.0.0.1:8080"


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message."""
