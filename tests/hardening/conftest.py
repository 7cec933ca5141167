"""Fixtures for the attack tests: an upstream that answers with whatever raw bytes a test gives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from tests.support.harness import LoopThread


@pytest.fixture
def raw_upstream_of(servers: LoopThread) -> Iterator[Callable[[bytes], str]]:
    """`raw_upstream_of(bytes)`: a base URL whose server answers every request with those bytes
    (read the request, write them, keep the connection open until the client leaves)."""
    started: list[asyncio.base_events.Server] = []

    def make(answer: bytes) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
                await reader.read()  # until the client hangs up
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        async def start() -> asyncio.base_events.Server:
            return await asyncio.start_server(serve, "127.0.0.1", 0)

        server = servers.run(start())
        started.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    yield make

    async def stop(server: asyncio.base_events.Server) -> None:
        server.close()

    for server in started:
        servers.run(stop(server))
