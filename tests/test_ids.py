"""A new session's id (protoflask/ids.py): the fast one is ``uuid4().hex`` byte for byte."""

from __future__ import annotations

import os
import uuid

import pytest

from protoflask import ids


@pytest.mark.parametrize("raw", [bytes(16), b"\xff" * 16, bytes(range(16)),
                                 bytes(range(240, 256))] + [os.urandom(16) for _ in range(50)])
def test_the_same_bytes_give_the_same_id(monkeypatch: pytest.MonkeyPatch, raw: bytes) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: raw[:n])
    assert ids.fast_uuid4_hex() == ids.plain_uuid4_hex() == uuid.UUID(bytes=raw, version=4).hex


def test_an_id_is_a_version_4_uuid_and_the_swap_point_is_the_fast_one() -> None:
    assert ids.new_session_id is ids.fast_uuid4_hex
    made = {ids.new_session_id() for _ in range(1000)}
    assert len(made) == 1000
    for value in made:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
