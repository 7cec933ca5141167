"""Which upstreams are busy with an agent's request right now, so that background work yields.

A local model often serves one request at a time (llama.cpp with one slot, Ollama with
OLLAMA_NUM_PARALLEL=1): a summary sent to it while the agent waits for an answer delays that
answer by the whole summary. With `summarizer.yield_to_agent`, a summary waits until no agent
request is in flight on its upstream, and when an agent request starts meanwhile the summary's
call is stopped and sent again once the upstream is free: a summary may come late, an agent's
request is never queued behind one.

The engine owns one InFlight; its router hands out the agent's upstreams already tracked by it
(`tracked`: their `call` is `agent_call`), and the summarizer's background calls go through
`background`. A request counts as in flight from the call until its reply is closed, streams
included.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .upstream import Upstream, UpstreamReply

T = TypeVar("T")


class InFlight:
    """Agent requests in flight per upstream, and background calls that yield to them."""

    def __init__(self) -> None:
        self._agents: dict[int, int] = {}  # id(upstream) -> agent requests in flight on it
        self._idle: dict[int, asyncio.Event] = {}  # set while no agent request is in flight
        self._background: dict[int, set[asyncio.Task[Any]]] = {}
        self._preempted: set[asyncio.Task[Any]] = set()
        self.preemptions = 0  # background calls stopped for an agent's request (for tests and metrics)
        self.waiting = 0  # background calls waiting for their upstream to be free, now

    def busy(self, upstream: Upstream) -> bool:
        return self._agents.get(id(upstream), 0) > 0

    def tracked(self, upstream: Upstream) -> TrackedUpstream:
        """`upstream` as the agent's requests use it: each call is in flight until its reply closes."""
        return TrackedUpstream(upstream, self)

    async def agent_call(
        self, upstream: Upstream, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = ""
    ) -> UpstreamReply:
        """`upstream.call(dialect, body, headers, query)`, counted in flight until the reply is closed."""
        key = id(upstream)
        self._start(key)
        try:
            reply = await upstream.call(dialect, body, headers, query)
        except BaseException:
            self._end(key)
            raise
        return _TrackedReply(reply, lambda: self._end(key))

    async def background(self, upstream: Upstream, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call()` once no agent request is in flight on `upstream`; run it again from the
        start (once the upstream is free) each time an agent request starts meanwhile."""
        key = id(upstream)
        while True:
            if self._agents.get(key, 0):
                self.waiting += 1
                try:
                    await self._idle_event(key).wait()
                finally:
                    self.waiting -= 1
                continue
            task = asyncio.ensure_future(call())
            self._background.setdefault(key, set()).add(task)
            try:
                return await task
            except asyncio.CancelledError:
                if task not in self._preempted:
                    raise  # our own caller was cancelled (shutdown, a timeout): the task went with it
                self._preempted.discard(task)
                self.preemptions += 1
            finally:
                tasks = self._background.get(key)
                if tasks is not None:
                    tasks.discard(task)
                    if not tasks:
                        del self._background[key]

    def _start(self, key: int) -> None:
        self._agents[key] = self._agents.get(key, 0) + 1
        self._idle_event(key).clear()
        for task in self._background.get(key, ()):
            if not task.done():
                self._preempted.add(task)
                task.cancel()

    def _end(self, key: int) -> None:
        left = self._agents.get(key, 0) - 1
        if left > 0:
            self._agents[key] = left
            return
        self._agents.pop(key, None)
        event = self._idle.pop(key, None)  # nothing is kept for an idle upstream
        if event is not None:
            event.set()

    def _idle_event(self, key: int) -> asyncio.Event:
        event = self._idle.get(key)
        if event is None:
            event = self._idle[key] = asyncio.Event()
        return event


class TrackedUpstream:
    """An upstream whose calls are an agent's (InFlight.agent_call); anything else is the upstream's own."""

    def __init__(self, upstream: Upstream, inflight: InFlight) -> None:
        self.upstream, self.inflight = upstream, inflight

    async def call(
        self, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = ""
    ) -> UpstreamReply:
        return await self.inflight.agent_call(self.upstream, dialect, body, headers, query)

    async def chat(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> UpstreamReply:
        return await self.call("chat", body, headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.upstream, name)


class _TrackedReply:
    """An UpstreamReply that tells the tracker when it is closed (once)."""

    def __init__(self, reply: UpstreamReply, on_close: Callable[[], None]) -> None:
        self._reply = reply
        self._on_close: Callable[[], None] | None = on_close
        self.status = reply.status
        self.headers = reply.headers

    @property
    def is_event_stream(self) -> bool:
        return self._reply.is_event_stream

    async def read(self) -> bytes:
        return await self._reply.read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._reply.chunks()  # the reply's own iterator: no cost per chunk

    def close(self) -> None:
        self._reply.close()
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


__all__ = ["InFlight", "TrackedUpstream"]
