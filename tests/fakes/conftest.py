"""Fixtures for the fakes' own tests: a fake upstream of the test's own (on its own loop, driven
cross-thread), the async openai client on it, and a plain aiohttp session for raw requests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from tests.fakes.fake_upstream import FakeUpstream, running_in_thread


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    """A fake upstream of the test's own, for the fake's tests. It runs on its own loop in another
    thread, as the scripting API promises to support: those tests drive it cross-thread."""
    with running_in_thread() as server:
        yield server


@pytest_asyncio.fixture
async def sdk(fake: FakeUpstream) -> AsyncIterator[AsyncOpenAI]:
    """The async openai client on `fake`."""
    client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    yield client
    await client.close()


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session
