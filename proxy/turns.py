"""The store side of one turn: its new items go in as pending, then end live or failed.

Two writes on a turn's path: the new items before anything is forwarded, and the end (statuses,
the reply, the turn's record, its upstream calls, first-forwarded marks and the cuts its stages
moved) in one step.

Every write of a turn runs as its own task, chained after the previous one and shielded from
the request's cancellation: a client that hangs up mid-turn cannot leave a write half done, and
`settled()` lets the conversation lock wait for the last write before the next turn reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .history import TurnPlan
from .identity import ConversationKey
from .request_limits import off_loop
from .store import FAILED, INCOMPLETE, INTERNAL, LIVE, PENDING, SUPERSEDED, Store
from .transcript import Codec, Raw

if TYPE_CHECKING:
    from .engine.report import TurnReport
    from .request_parts import PartsToKeep


class TurnWriter:
    def __init__(self, store: Store, key: ConversationKey, plan: TurnPlan, codec: Codec) -> None:
        self.store, self.key, self.plan, self.codec = store, key, plan, codec
        self.pending: list[int] = []
        # What went upstream, kept with the turn once it ends: set once the prompt is built.
        self.report: TurnReport | None = None
        self.ended: tuple[str, str] | None = None  # (the turn's items' status, the reply's) once stored
        # Kept with the turn's end: the upstream calls it made, and when its messages were first forwarded.
        self.llm_calls = 0
        self.forwarded: dict[int, int] = {}
        self._last: asyncio.Future[Any] | None = None
        # The turn's system prompt and tools when they may be new to the store (request_parts.py):
        # kept with its first write. None: the previous turn's, nothing to write.
        self.parts: PartsToKeep | None = None

    def _then(self, step: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        previous = self._last

        async def run() -> Any:
            if previous is not None:
                await previous
            return await step()

        self._last = asyncio.ensure_future(run())
        return asyncio.shield(self._last)

    async def begin(self) -> None:
        """Write the turn's new items as pending (and its system prompt and tools if new), before
        anything is forwarded."""

        async def step() -> None:
            if self.plan.new:
                self.pending = await self.store.append(self.key, self.plan.new, self.plan.new_hashes, PENDING)
            if self.parts is not None:
                await self.parts.keep(self.store, self.key)

        await self._then(step)

    async def internal(self, raws: list[Raw], hashes: list[str]) -> None:
        """A read-back round the proxy answered itself: kept in the trajectory, never live."""
        await self._then(lambda: self.store.append(self.key, raws, hashes, INTERNAL))

    async def fail(self) -> None:
        """Refused or failed: the live transcript stays as it was; the attempt stays in the trajectory."""
        await self._then(lambda: self._end(FAILED, [], FAILED))

    async def accept(self, reply: list[Raw], reply_status: str = LIVE) -> None:
        """The turn joins the live transcript (superseding what it diverged from), its reply after it."""
        await self._then(lambda: self._end(LIVE, reply, reply_status))

    async def keep_partial(self, reply: list[Raw]) -> None:
        """The turn failed mid-reply; the part the upstream sent stays in the trajectory as incomplete."""
        await self._then(lambda: self._end(FAILED, reply, INCOMPLETE))

    async def _end(self, status: str, reply: list[Raw], reply_status: str) -> None:
        changes = dict.fromkeys(self.pending, status)
        if status == LIVE:
            changes |= dict.fromkeys(self.plan.supersede, SUPERSEDED)
        record = self.report.record(status, self.pending) if self.report is not None else None
        hashes = await off_loop(sum(_size(raw) for raw in reply), lambda: [self.codec.hash(raw) for raw in reply])
        await self.store.finish_turn(
            self.key, changes, list(zip(reply, hashes, strict=True)), reply_status, record,
            llm_calls=self.llm_calls, forwarded=self.forwarded,
            marks=self.report.marks if self.report is not None else None,
        )
        self.ended = (status, reply_status)

    async def settled(self) -> None:
        """Wait for the last write to land, even if this request is being cancelled."""
        if self._last is None:
            return
        cancelled = False
        while not self._last.done():
            try:
                await asyncio.wait([self._last])
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError


def _size(raw: Raw) -> int:
    """A cheap lower bound of an item's size: its text fields' lengths."""
    return sum(len(v) for v in raw.values() if isinstance(v, str)) + sum(
        len(p.get("text") or "") for v in raw.values() if isinstance(v, list) for p in v if isinstance(p, dict)
    )
