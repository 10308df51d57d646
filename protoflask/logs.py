"""Logging set-up for the standalone server (an embedding application keeps its own), and
the redaction that keeps tokens out of every log line."""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import unquote_plus

#: The query keys logged in clear: the ones the server reads that carry no secret. Every
#: other key (``token``, ``ticket``, and anything unknown, such as near misses like
#: ``token%00`` or ``jwt``) is logged as ``<key>=[redacted]``.
CLEAR_QUERY_KEYS = frozenset({"session", "last_seq", "since", "scope"})
REDACTED = "[redacted]"
#: A key shown as itself when it is redacted (a long or odd key may be the secret).
_SHOWABLE_KEY = re.compile(r"[A-Za-z0-9_.%+\[\]-]{1,32}\Z")
#: A query string inside a log line (a request line, a URL).
_QUERY = re.compile(r"\?([^\s\"'#]*)")
#: ``token=<value>`` outside a query (belt and braces), its key possibly percent-encoded.
_TOKEN_PARAM = re.compile(r"((?:t|%74)(?:o|%6f)(?:k|%6b)(?:e|%65)(?:n|%6e)=)[^&\s'\"]*",
                          re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)[^\s'\",]+", re.IGNORECASE)


def redacted_query(query: str) -> str:
    """A query string with every value hidden but those of CLEAR_QUERY_KEYS (the key
    compared after decoding, as the server's own parser sees it)."""
    if not query:
        return query
    out = []
    for pair in query.split("&"):
        if not pair:
            continue
        key, sep, _ = pair.partition("=")
        if sep and unquote_plus(key) in CLEAR_QUERY_KEYS:
            out.append(pair)
        else:
            out.append(f"{key if _SHOWABLE_KEY.match(key) else REDACTED}={REDACTED}")
    return "&".join(out)


def redact(text: str) -> str:
    """``text`` with query values (but the allowed keys'), token values and Bearer
    credentials replaced by [redacted] / ***."""
    if "?" in text:
        text = _QUERY.sub(lambda m: "?" + redacted_query(m.group(1)), text)
    if "=" in text:
        text = _TOKEN_PARAM.sub(r"\1" + REDACTED, text)
    if " " in text:
        text = _BEARER.sub(r"\1***", text)
    return text


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
