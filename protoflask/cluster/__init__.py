"""Scale-out on Redis: the session registry, delivery and replay windows shared by every
worker and node (``RedisHub``), chosen by the ``redisUrl`` option."""

from .hub import RedisHub

__all__ = ["RedisHub"]
