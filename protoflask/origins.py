"""The browser Origin allow-list (``allowedOrigins``) against cross-site use of /proto/*.

Entries are origins as browsers send them (``https://app.example.com``,
``http://localhost:3000``), ``https://*.example.com`` for any subdomain, ``null`` for
sandboxed or file:// pages, or ``*`` for any origin. An empty list allows every origin
(the default: tokens travel in the query or the Authorization header, never in cookies,
so another site cannot ride on a user's session without already holding their token).
Requests without an Origin header (non-browser clients) are always allowed.
"""

from __future__ import annotations

import re
from typing import Iterable

_ORIGIN = re.compile(r"(https?|wss?)://(\*\.)?([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?/?\Z")
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def normalize_origin(entry: str) -> str:
    """An allow-list entry in the form browsers send (lower case, no default port, no
    trailing slash), or ValueError."""
    text = entry.strip().lower()
    if text in ("*", "null"):
        return text
    match = _ORIGIN.match(text)
    if match is None:
        raise ValueError(f"not an origin like https://app.example.com: {entry!r}")
    scheme, wildcard, host, port = match.groups()
    port_part = "" if port is None or port == _DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{wildcard or ''}{host}{port_part}"


class OriginPolicy:
    def __init__(self, allowed: Iterable[str]) -> None:
        entries = {normalize_origin(e) for e in allowed}
        self.restricted = bool(entries) and "*" not in entries
        self._exact = {e for e in entries if "://*." not in e}
        # "https://*.example.com" -> ("https://", ".example.com", ":8443" or "")
        self._wildcards = [(e.split("*.")[0], "." + e.split("*.")[1]) for e in entries
                           if "://*." in e]

    def allows(self, origin: str | None) -> bool:
        """Whether a request with this Origin header may use /proto/*."""
        if origin is None or not self.restricted:
            return True
        try:
            candidate = normalize_origin(origin)
        except ValueError:
            return False
        if candidate in self._exact:
            return True
        for scheme, suffix in self._wildcards:
            if candidate.startswith(scheme) and candidate[len(scheme):].endswith(suffix) \
                    and len(candidate) > len(scheme) + len(suffix):
                return True
        return False
