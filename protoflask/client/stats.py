"""GET /stats: the server's figures, which need no token (docs/OPERATIONS.md)."""

from __future__ import annotations

import http.client
import json
from typing import Any

from ._http import BaseURL, failed, refused


def get_stats(url: str, timeout: float | None) -> Any:
    """The server's /stats JSON; raises ConnectionFailed or ConnectionRefused."""
    base = BaseURL(url)
    conn = None
    try:
        conn = base.http(timeout)
        conn.request("GET", base.path("/stats"), headers={"Accept": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise failed(exc, base) from None
    finally:
        if conn is not None:
            conn.close()
    if resp.status != 200:
        raise refused(resp.status, body)
    return json.loads(body)
