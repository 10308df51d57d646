"""``SessionPostLane.app_is_plain``: the hook tables read by their shape (the swap point
``plain_by_shape``) answer as the walk of every table and signal does, whatever the
application added to its Flask app, through Flask's decorators or the tables directly;
and the upgrade's Host verdicts remembered (``post_lane.REMEMBER_HOSTS``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from flask import signals as flask_signals

from protoflask import ProtoServer
from protoflask.post_lane import SessionPostLane
from protoflask.web import BLUEPRINT_NAME

from ..support import SECRET


def hook(*_: Any) -> None:
    return None


def receiver(*_: Any, **__: Any) -> None:
    return None


#: (what the application does to its app, whether the lane may still answer)
CHANGES: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "nothing": (lambda app: None, True),
    "an app-wide before_request": (lambda app: app.before_request(hook), False),
    "an app-wide after_request": (lambda app: app.after_request(hook), False),
    "a teardown_request": (lambda app: app.teardown_request(hook), False),
    "a url_value_preprocessor": (lambda app: app.url_value_preprocessor(hook), False),
    "a teardown_appcontext": (lambda app: app.teardown_appcontext(hook), False),
    "a SERVER_NAME": (lambda app: app.config.update(SERVER_NAME="h.example"), False),
    "an empty list of another owner (a defaultdict's read)":
        (lambda app: app.before_request_funcs["other"], True),
    "an empty list of another owner, and a hook of a third":
        (lambda app: (app.after_request_funcs["other"],
                      app.after_request_funcs.setdefault("third", []).append(hook)), False),
    "protoflask's own before_request list emptied":
        (lambda app: app.before_request_funcs[BLUEPRINT_NAME].clear(), False),
    "protoflask's own before_request list taken out":
        (lambda app: app.before_request_funcs.pop(BLUEPRINT_NAME), True),
    "a second hook in protoflask's list":
        (lambda app: app.after_request_funcs[BLUEPRINT_NAME].append(hook), False),
    "an empty teardown list of protoflask's":
        (lambda app: app.teardown_request_funcs[BLUEPRINT_NAME], True),
    "a table replaced by a plain dict":
        (lambda app: setattr(app, "url_value_preprocessors", {None: [hook]}), False),
    "request_started for this app":
        (lambda app: flask_signals.request_started.connect(receiver, app), False),
    "appcontext_popped for any sender":
        (lambda app: flask_signals.appcontext_popped.connect(receiver), False),
    "request_finished for another sender":
        (lambda app: flask_signals.request_finished.connect(receiver, object()), True),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_shape_answers_as_the_walk(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = ProtoServer({"jwtSecret": SECRET, "enableLogging": False})
    lane = server.app.wsgi_app
    assert isinstance(lane, SessionPostLane)
    act, plain = CHANGES[change]
    try:
        act(server.app)
        verdicts = []
        for by_shape in (True, False):
            monkeypatch.setattr(SessionPostLane, "plain_by_shape", by_shape)
            verdicts.append(lane.app_is_plain())
        assert verdicts == [plain, plain]
    finally:
        for signal in (flask_signals.request_started, flask_signals.appcontext_popped,
                       flask_signals.request_finished):
            signal.disconnect(receiver)


HOSTS = [None, "", "127.0.0.1:8080", "h.example", "[::1]:80", "a b", "h,h", "h:99999",
         "h:123456", "é", "h.example:", "[::1", "x" * 300]


def test_the_host_verdicts_remembered_are_valid_hosts(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """The swap point ``post_lane.REMEMBER_HOSTS``: each Host value's verdict, worked out
    then remembered, is ``web.valid_host``'s; the memory bounded."""
    from protoflask import post_lane
    from protoflask.web import valid_host

    monkeypatch.setattr(post_lane, "_hosts", {})
    for remember in (False, True, True):
        monkeypatch.setattr(post_lane, "REMEMBER_HOSTS", remember)
        assert [post_lane.host_ok(h) for h in HOSTS] == [valid_host(h) for h in HOSTS]
    assert post_lane._hosts
    for i in range(100):
        post_lane.host_ok(f"h{i}")
    assert len(post_lane._hosts) <= 64
