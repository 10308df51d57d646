"""``LiveSession.notify``'s swap point: ``notify_plain`` (ring the transport's bell, or
stamp what is queued while disconnected) and ``notify_fast`` (``Bell.ring``'s first test,
the puller's own ring dropped, read before the call). The same rings over both: from the
puller greenlet, from another, with no puller, with nothing wanted, while disconnected."""

from __future__ import annotations

from typing import Any

import gevent
import pytest
from gevent import getcurrent

from protoflask.bell import Bell
from protoflask.core import messages
from protoflask.live import LiveSession

from .test_engine import Harness


def test_the_fast_one_is_in_use() -> None:
    assert LiveSession.notify is LiveSession.notify_fast


def rings(how: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(LiveSession, "notify", getattr(LiveSession, how))
    h = Harness()
    live, transport = h.connect()
    h.hello(live)
    answered: list[str] = []
    seen: list[Any] = []
    other = gevent.spawn(lambda: None)
    cases = [("no puller", None, None), ("the puller rings", getcurrent(), None),
             ("another's puller", other, None), ("nothing wanted", None, lambda: False),
             ("something wanted", other, lambda: True)]
    for name, puller, wanted in cases:
        transport.bell = Bell(lambda name=name: answered.append(name), puller, wanted=wanted)
        live.notify()
        gevent.sleep(0)
        seen.append((name, list(answered)))
        answered.clear()
    h.engine.detach(live, transport)
    live.core.send(messages.tool_list([]))
    before = live.core.outbound.replay.nbytes
    live.notify()  # disconnected: what is queued is stamped into the window
    seen.append(("disconnected", live.core.outbound.replay.nbytes > before,
                 live.has_writable()))
    return seen


@pytest.mark.parametrize("how", ["notify_plain", "notify_fast"])
def test_rings_as_the_plain_path_rings(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = rings(how, monkeypatch)
    monkeypatch.undo()
    assert seen == rings("notify_plain", monkeypatch)
    assert [s[1] for s in seen[:5]] == [["no puller"], [], ["another's puller"], [],
                                        ["something wanted"]]
    assert seen[5] == ("disconnected", True, False)
