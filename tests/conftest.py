"""Fixtures: a loop thread hosting the strict fake upstream and per-test proxies on loopback."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.harness import (
    LoopThread,
    ProxyProcess,
    ProxyServer,
    merge_sections,
    proxy_settings,
    start_processes,
    write_config,
)
from tests.support.redis_server import RedisServer

ALICE = "sk-test-alice-0123456789"
BOB = "sk-test-bob-9876543210"

# A developer's own settings must not leak into the tests (nor their OpenTelemetry collector).
for name in list(os.environ):
    if name.startswith(("CONTEXT_PROXY_", "OTEL_")):
        del os.environ[name]


@pytest.fixture(scope="session")
def servers() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def _upstream(servers: LoopThread) -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    servers.run(fake.start())
    yield fake
    servers.run(fake.close())


@pytest.fixture
def upstream(_upstream: FakeUpstream) -> FakeUpstream:
    _upstream.reset()
    return _upstream


MakeProxy = Callable[..., ProxyServer]


@pytest.fixture
def make_proxy(servers: LoopThread, upstream: FakeUpstream, tmp_path: Path) -> Iterator[MakeProxy]:
    """Start a proxy: `make_proxy(data_dir=..., upstream_url=..., <section>={...})`."""
    started: list[ProxyServer] = []

    def make(data_dir: Path | None = None, upstream_url: str | None = None, **sections: Any) -> ProxyServer:
        settings = proxy_settings(upstream_url or upstream.base_url, data_dir or tmp_path / "data", **sections)
        server = ProxyServer(servers, settings).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


MakeProcesses = Callable[..., list[ProxyProcess]]


@pytest.fixture
def processes(tmp_path: Path, upstream: FakeUpstream) -> Iterator[MakeProcesses]:
    """`processes(n, **sections)`: n `python -m proxy serve` processes sharing one config: the fake
    upstream, a diskcache store in the test's tmp dir, overridden by `sections`."""
    started: list[ProxyProcess] = []

    def make(n: int = 1, **sections: dict[str, Any]) -> list[ProxyProcess]:
        config = merge_sections(
            {"upstream": {"base_url": upstream.base_url, "timeout_s": 30}, "storage": {"path": str(tmp_path / "data")}},
            sections,
        )
        path = write_config(tmp_path / f"config-{len(started)}.yaml", **config)
        procs = [ProxyProcess(path, tmp_path / f"proxy-{len(started) + i}.log") for i in range(n)]
        started.extend(procs)
        return start_processes(*procs)

    yield make
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop()


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own on a free loopback port: nothing of another test in it."""
    server = RedisServer().start()
    yield server
    server.remove()


@pytest.fixture
def proxy(make_proxy: MakeProxy) -> ProxyServer:
    return make_proxy()


def openai_client(
    proxy: ProxyServer, api_key: str = ALICE, base_url: str | None = None, headers: dict[str, str] | None = None
) -> OpenAI:
    return OpenAI(base_url=base_url or proxy.base_url, api_key=api_key, max_retries=0, default_headers=headers)


def async_openai_client(
    proxy: ProxyServer, api_key: str = ALICE, base_url: str | None = None, headers: dict[str, str] | None = None
) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url or proxy.base_url, api_key=api_key, max_retries=0, default_headers=headers)


@pytest.fixture
def client(proxy: ProxyServer) -> OpenAI:
    return openai_client(proxy)


@pytest.fixture
def http(proxy: ProxyServer) -> Iterator[httpx.Client]:
    """Raw HTTP to the proxy, for what the SDK would not send (bad bodies, admin calls): its admin
    API calls as the admin (its token), unless a call names other credentials."""
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as c:
        yield c


def admin_get(http: httpx.Client, path: str, api_key: str | None = None, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return http.get(f"/v1/conversations{path}", headers=headers, params=params)


def live_messages(http: httpx.Client, conversation_id: str, api_key: str | None = None) -> list[dict[str, Any]]:
    """The stored live transcript, stripped of our bookkeeping fields."""
    response = admin_get(http, f"/{conversation_id}/messages", api_key, limit=1000)
    assert response.status_code == 200, response.text
    return [{k: v for k, v in m.items() if k not in ("seq", "created_at")} for m in response.json()["data"]]


def trajectory(http: httpx.Client, conversation_id: str, api_key: str | None = None) -> list[dict[str, Any]]:
    response = admin_get(http, f"/{conversation_id}/trajectory", api_key, limit=1000)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def leave_mid_stream(
    http: httpx.Client, upstream: FakeUpstream, conversation_id: str, text: str, content: str = "go", lines: int = 1
) -> tuple[Reply, list[str]]:
    """A streamed chat turn whose client hangs up after `lines` data lines, while the upstream is
    held mid-reply (the reply, still held: `release()` it; and the lines the client read)."""
    reply = Reply.text(text, chunk_size=4, pause_after_chunks=4)
    upstream.enqueue(reply)
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": conversation_id}
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        data_lines = (line for line in r.iter_lines() if line.startswith("data: "))
        read = [next(data_lines) for _ in range(lines)]
        assert reply.reached.wait(10)  # the upstream is held at its pause point right now
    return reply, read
