"""Scale-out on Redis: the session registry, delivery and replay windows shared by every
worker and node (``RedisHub``), chosen by the ``redisUrl`` option (``make_hub``).

The Redis client is imported only with ``redisUrl``: a server on one process never
loads it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hub import LocalHub

if TYPE_CHECKING:
    from ..config import ServerConfig

__all__ = ["RedisHub", "make_hub"]


def make_hub(config: "ServerConfig") -> LocalHub:
    """The hub the configuration asks for: Redis-backed with ``redisUrl`` or
    ``redisSentinels``, else in memory."""
    target = config.redis_target
    if target:
        from .hub import RedisHub

        return RedisHub(target, config.redis_prefix, config=config)
    return LocalHub()


def __getattr__(name: str) -> Any:
    if name == "RedisHub":
        from .hub import RedisHub

        return RedisHub
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
