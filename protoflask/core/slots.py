"""Fast constructors for the core's frozen dataclasses, one of which is built for every
message: setting a field through its slot's descriptor skips the name lookup and the
frozen check that the generated ``__init__`` pays through ``object.__setattr__`` (about
half the cost of building one). The instances stay frozen and compare as before.
"""

from __future__ import annotations

from typing import Any, Callable


class _Fresh(dict[str, Any]):
    """The default of a payload argument: a new empty dict is made for each instance."""


#: the marker a constructor replaces by a fresh ``{}`` (``field(default_factory=dict)``)
FRESH: Any = _Fresh()


def slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each named slot of a slotted class, in order."""
    return tuple(cls.__dict__[name].__set__ for name in names)
