"""Fixtures for the store's tests: one real redis-server for the session (tests keep apart by a
key prefix of their own; a test that needs a server to itself takes `redis` from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server for a test session; tests keep apart by a key prefix of their own."""
    server = RedisServer().start()
    yield server
    server.remove()
