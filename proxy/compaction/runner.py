"""Runs compactions: in the background after the reply (the default) or before forwarding, one at a
time per conversation (a store lease, so across replicas too for a shared store). A failure is
logged and counted; the conversation simply compacts on a later turn. Nothing is ever lost: a
compaction only adds a summary and moves the boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..config import Settings
from ..identity import ConversationKey
from ..metrics import Metrics
from ..store import Store, Summary
from ..summarizer import Summarizer, SummarizerFailed
from ..tokens import TokenCounter
from . import compactor_class
from .base import CompactionJob, Compactor

log = logging.getLogger("proxy.compaction")

LEASE_MARGIN_S = 30


class CompactionRunner:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        summarizer: Summarizer,
        counter: TokenCounter,
        metrics: Metrics,
        on_summary: Callable[[ConversationKey], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.on_summary = on_summary  # told of every new summary (the trajectory file shows it)
        self.metrics = metrics
        self.lease_ttl = settings.summarizer.timeout_s * 4 + LEASE_MARGIN_S  # chunked windows take several calls
        self._compactors: dict[str, Compactor] = {}
        for name in [None, *settings.profiles]:
            compaction = settings.profile(name).compaction  # type: ignore[union-attr]
            path = compaction.compactor_class
            if compaction.strategy in ("turns", "budget") and path not in self._compactors:
                self._compactors[path] = compactor_class(path)(store, summarizer, counter)
        self._tasks: set[asyncio.Task[None]] = set()
        self.runs = 0
        self.failures = 0

    def compactor(self, job: CompactionJob) -> Compactor | None:
        compaction = job.profile.compaction
        if compaction.strategy not in ("turns", "budget"):
            return None
        return self._compactors.get(compaction.compactor_class or "")

    async def current_summary(self, job: CompactionJob) -> Summary | None:
        compactor = self.compactor(job)
        return await compactor.get_summary(job.key) if compactor is not None else None

    async def run_now(self, job: CompactionJob) -> Summary | None:
        """Compact if due, under the conversation's lease; None if nothing was due, busy or failed."""
        compactor = self.compactor(job)
        if compactor is None:
            return None
        lease = f"compact:{job.key}"
        token = await self.store.acquire_lease(lease, self.lease_ttl)
        if token is None:
            return None  # another compaction of this conversation is running
        try:
            summary = await compactor.compact_if_needed(job)
            if summary is not None:
                self.runs += 1
                self.metrics.compactions.labels("done").inc()
                if self.on_summary is not None:
                    await self.on_summary(job.key)
            return summary
        except SummarizerFailed as exc:
            self.failures += 1
            self.metrics.compactions.labels("failed").inc()
            log.warning("compaction failed; the window trims meanwhile", extra={"conversation": str(job.key), "reason": str(exc)})
            return None
        except Exception:
            self.failures += 1
            self.metrics.compactions.labels("failed").inc()
            log.exception("compaction crashed", extra={"conversation": str(job.key)})
            return None
        finally:
            await self.store.release_lease(lease, token)

    def schedule(self, job: CompactionJob) -> None:
        """Compact after the reply, off the request's path; the next request uses the newest summary."""
        if self.compactor(job) is None:
            return
        task = asyncio.create_task(self._background(job))
        self._tasks.add(task)  # a reference, so the task is not garbage-collected mid-run
        task.add_done_callback(self._tasks.discard)

    async def _background(self, job: CompactionJob) -> None:
        await self.run_now(job)

    async def idle(self) -> None:
        """Wait for every compaction running now (shutdown, and tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
