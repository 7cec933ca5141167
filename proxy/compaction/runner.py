"""Runs compactions: in the background after the reply (the default) or before forwarding, one at a
time per conversation (a store lease, so across replicas too for a shared store). A failure is
logged and counted; the conversation compacts on a later turn. Nothing is ever lost: a
compaction only adds a summary and moves the boundary.

After a failure the retry backs off, so a summarizer that keeps failing (a model too small for
the window, an outage) is not called again on every turn: the conversation skips its next turn's
compaction (then 2, 4, ... up to 16 turns), and the lease stays held for `retry_backoff_s`
(doubling likewise), which other replicas of a shared store respect too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
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
MAX_BACKOFF_FACTOR = 16
MAX_TRACKED_FAILURES = 10_000  # conversations whose last compaction failed, remembered per process


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
        # conversation -> (consecutive failures, turns still to skip); oldest first, bounded
        self._backoff: OrderedDict[str, tuple[int, int]] = OrderedDict()
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
        """Compact if due, under the conversation's lease; None if nothing was due, busy, backing
        off after a failure, or failed."""
        compactor = self.compactor(job)
        if compactor is None or self._skip_turn(str(job.key)):
            return None
        lease = f"compact:{job.key}"
        token = await self.store.acquire_lease(lease, self.lease_ttl)
        if token is None:
            return None  # another compaction of this conversation is running, or a failed one backs off
        hold_s: float | None = None
        try:
            summary = await compactor.compact_if_needed(job)
            self._backoff.pop(str(job.key), None)
            if summary is not None:
                self.runs += 1
                self.metrics.compactions.labels("done").inc()
                if self.on_summary is not None:
                    await self.on_summary(job.key)
            return summary
        except SummarizerFailed as exc:
            hold_s = self._failed(job)
            log.warning(
                "compaction failed; the window trims meanwhile",
                extra={"conversation": str(job.key), "reason": str(exc), "retry_after_s": hold_s},
            )
            return None
        except Exception:
            hold_s = self._failed(job)
            log.exception("compaction crashed", extra={"conversation": str(job.key)})
            return None
        finally:
            await self.store.release_lease(lease, token)
            if hold_s:
                await self.store.acquire_lease(lease, hold_s)  # held until it expires: the backoff

    def _failed(self, job: CompactionJob) -> float:
        """Count a failure and set the backoff; returns how long the lease stays held."""
        self.failures += 1
        self.metrics.compactions.labels("failed").inc()
        name = str(job.key)
        failures = self._backoff.pop(name, (0, 0))[0] + 1
        factor = min(2 ** (failures - 1), MAX_BACKOFF_FACTOR)
        self._backoff[name] = (failures, factor)
        while len(self._backoff) > MAX_TRACKED_FAILURES:
            self._backoff.popitem(last=False)
        return job.profile.compaction.retry_backoff_s * factor

    def _skip_turn(self, name: str) -> bool:
        failures, skip = self._backoff.get(name, (0, 0))
        if skip <= 0:
            return False
        self._backoff[name] = (failures, skip - 1)
        return True

    def schedule(self, job: CompactionJob) -> None:
        """Compact after the reply, off the request's path; the next request uses the newest summary."""
        if self.compactor(job) is None:
            return
        task = asyncio.create_task(self._background(job))
        self._tasks.add(task)  # a reference, so the task is not garbage-collected mid-run
        task.add_done_callback(self._tasks.discard)

    async def _background(self, job: CompactionJob) -> None:
        await self.run_now(job)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def idle(self) -> None:
        """Wait for every compaction running now (shutdown, and tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
