"""Logging set-up for the standalone server (an embedding application keeps its own)."""

from __future__ import annotations

import logging
import os


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
