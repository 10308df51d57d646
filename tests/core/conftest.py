"""Shared fixtures for the sans-I/O core tests."""

from __future__ import annotations

import pytest

from ._support import Client, make_session


@pytest.fixture
def session():
    """A connected session with default settings, created and attached at t=0."""
    return make_session()


@pytest.fixture
def client(session):
    """A client that has completed the handshake (HELLO reply already taken)."""
    c = Client(session)
    c.handshake()
    return c
