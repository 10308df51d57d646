"""protoflask/pins.py: the third-party internals the fast paths read are there in the
installed versions, and one that is not stops the import with its name and reader."""

from __future__ import annotations

import importlib
import sys

import pytest
import websockets.server

import protoflask
import protoflask.web
from protoflask import pins


@pytest.mark.parametrize("check", [pins.check_websockets, pins.check_redis, pins.check_flask])
def test_the_installed_versions_have_what_the_fast_paths_read(check) -> None:
    check()


def test_a_missing_internal_names_itself_and_its_reader() -> None:
    class Renamed:
        writes: list[bytes] = []

    with pytest.raises(pins.InternalsMissing, match=r"websockets \S+ has no parser_exc, "
                       r"current_size on Renamed, which the frame reader reads"):
        pins.require("websockets", Renamed(), ("writes", "parser_exc", "current_size"),
                     "the frame reader")


def test_a_websockets_without_them_stops_the_import_of_the_web_layer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a release that renamed ``ServerProtocol.writes`` would: protoflask.web (what
    serves the WebSocket route) does not import."""
    original = websockets.server.ServerProtocol.__init__

    def without_writes(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        del self.writes

    monkeypatch.setattr(websockets.server.ServerProtocol, "__init__", without_writes)
    saved = sys.modules.pop("protoflask.web")
    try:
        with pytest.raises(pins.InternalsMissing, match="writes"):
            importlib.import_module("protoflask.web")
    finally:
        sys.modules["protoflask.web"] = saved
        protoflask.web = saved  # type: ignore[attr-defined]  # (the failed import's)
