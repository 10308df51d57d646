"""When a missing beat or a missing record can be believed, and the 503 to answer until
then.

After an outage, or after Redis lost its data (FLUSHALL, an empty restart), a holder
needs a moment to write its sessions back: until then its beat or its session's record
may be missing although it serves the session. A node takes a session over from a node
whose beat is missing, or answers 404 for a session whose record is missing, only once
Redis has answered it for SETTLE_MS and no loss of data is more recent; before that, a
resume or POST gets 503 CLUSTER_UNAVAILABLE with Retry-After.
"""

from __future__ import annotations

from ..clock import now_ms
from ..core.errors import ClusterUnavailable
from .store import RedisStore

BEAT_MS = 1000  # how often a node says it is alive
NODE_TTL_MS = 3000  # a node that missed this long is gone (its sessions read disconnected)
SETTLE_MS = NODE_TTL_MS + 2 * BEAT_MS
RETRY_AFTER_S = 1  # what a 503 for a session that cannot be routed just now asks


def unavailable(message: str) -> ClusterUnavailable:
    """503 CLUSTER_UNAVAILABLE with Retry-After: the client tries again shortly."""
    exc = ClusterUnavailable(message)
    exc.retry_after = RETRY_AFTER_S
    return exc


def settled(reachable_since: int | None, store: RedisStore) -> bool:
    """Whether Redis has answered this node since ``reachable_since`` for SETTLE_MS, and
    no loss of Redis's data is more recent: then a missing beat or record means what it
    says."""
    now = now_ms()
    if reachable_since is None or now - reachable_since < SETTLE_MS:
        return False
    return now - store.loss_at(now) >= SETTLE_MS
