"""Logging set-up for the standalone server (an embedding application keeps its own), and
the redaction that keeps tokens out of every log line."""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import parse_qsl, urlencode

#: ``token=<value>`` anywhere in a line (a query string, a request line), its key possibly
#: percent-encoded (``%74oken=`` is ``token=`` to the query parser), and Bearer credentials.
_TOKEN_PARAM = re.compile(r"((?:t|%74)(?:o|%6f)(?:k|%6b)(?:e|%65)(?:n|%6e)=)[^&\s'\"]*",
                          re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)[^\s'\",]+", re.IGNORECASE)
REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with token values and Bearer credentials replaced by ***."""
    if "=" in text:
        text = _TOKEN_PARAM.sub(r"\1" + REDACTED, text)
    if " " in text:
        text = _BEARER.sub(r"\1" + REDACTED, text)
    return text


def redacted_query(query: str) -> str:
    """A query string with the value of every parameter the server reads as ``token``
    hidden (the key compared after decoding, as the server's own parser sees it)."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(key == "token" for key, _ in pairs):
        return redact(query)
    return urlencode([(k, REDACTED if k == "token" else v) for k, v in pairs],
                     safe="*/:")


class RedactTokens(logging.Filter):
    """Rewrites each record's message with ``redact`` (for loggers whose lines may quote
    a raw request line: the WSGI servers' error logs, gunicorn's access log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def configure_logging(level: str | None = None) -> None:
    """Log protoflask's connection and access lines to stderr unless ENABLE_LOGGING=false."""
    logger = logging.getLogger("protoflask")
    if logger.handlers:
        return
    enabled = os.environ.get("ENABLE_LOGGING", "true").strip().lower() not in (
        "0", "false", "no", "off")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level or ("INFO" if enabled else "WARNING"))
    logger.propagate = False
