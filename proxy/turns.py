"""The store side of one turn: its new items go in as pending, then end live or failed.

Two writes on a turn's path, each under the conversation's lock but never across the upstream
call: the new items, staged before anything is forwarded (their seqs given, seen by every read)
and durable before the first byte of a streamed reply goes to the client (`durable`, whose
commit overlaps the upstream call), and the end
(statuses, the reply, the turn's record, its upstream calls, first-forwarded marks and the cuts
its stages moved) in one step. A reply that comes whole (JSON, a refusal) is stored with the
items in one commit: the store writes staged items with the conversation's next write.

Every write of a turn runs as its own task (started at once, `eager`: one the store runs in
place ends without a task), chained after the previous one and shielded from the request's
cancellation: a client that hangs up mid-turn cannot leave a write half done, and `settled()`
lets the next turn wait for the last write before it reads.

Turns of one conversation in flight at once (a retry, a request sent before the last one ended):
a turn whose first new items are those an earlier turn in flight wrote (the same items after the
same history) takes that turn's seqs instead of writing them again (`adoptable`), so nothing is
stored twice. With full history (the request names its whole branch), the live transcript is the
request of the newest turn that ended well, by the order of their planning: such a turn supersedes whatever live items its request left out, another turn's
reply included; a turn that ends after a newer one took the live transcript ends superseded
itself (its items and reply kept in the trajectory), and never changes an item that is live.
With proxy history each turn's items and reply are added to the live transcript as it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .eager import eager
from .errors import ProxyError
from .history import TurnPlan
from .identity import ConversationKey
from .request_limits import off_loop
from .store import FAILED, INCOMPLETE, INTERNAL, LIVE, LIVE_ORDER_MARK, PENDING, SUPERSEDED, StoreUnavailable, TurnStore
from .transcript import Codec, Raw

if TYPE_CHECKING:
    from .engine.report import TurnReport
    from .request_parts import PartsToKeep


def adoptable(flying: list[TurnWriter], plan: TurnPlan) -> list[int]:
    """The seqs of the longest run of `plan`'s first new items that a turn in flight already
    wrote after the same history (a retry of a request still in flight; the system prompt of a
    conversation's first turns sent at once): empty if none did."""
    best: list[int] = []
    for other in flying:
        if other.plan.known_seqs != plan.known_seqs or len(other.pending) != len(other.plan.new_hashes):
            continue
        shared = 0
        for mine, theirs in zip(plan.new_hashes, other.plan.new_hashes, strict=False):
            if mine != theirs:
                break
            shared += 1
        if shared > len(best):
            best = other.pending[:shared]
    return list(best)


class TurnWriter:
    def __init__(
        self, store: TurnStore, key: ConversationKey, plan: TurnPlan, codec: Codec, *, order: int = 0,
        adopted: list[int] | None = None,
    ) -> None:
        self.store, self.key, self.plan, self.codec = store, key, plan, codec
        self.order = order  # where the turn's planning stood among its conversation's (its next_seq then)
        self.adopted = adopted or []  # seqs of its new items that a turn in flight wrote already
        self.contended = False  # another turn of the conversation was in flight beside it
        self.pending: list[int] = []
        self.lost: ProxyError | None = None  # the store failed to make the staged items durable
        self._durable: Awaitable[Any] | None = None
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

        self._last = eager(run())
        return asyncio.shield(self._last)  # a done future itself

    async def begin(self) -> None:
        """Write the turn's new items as pending (and its system prompt and tools if new), before
        anything is forwarded."""

        async def step() -> None:
            n = len(self.adopted)
            written = []
            if len(self.plan.new) > n:
                written = await self.store.stage(self.key, self.plan.new[n:], self.plan.new_hashes[n:], PENDING)
            self.pending = [*self.adopted, *written]
            if self.parts is not None:
                await self.parts.keep(self.store, self.key)

        await self._then(step)

    def durable(self) -> Awaitable[Any]:
        """Make the turn's new items durable: started as its request is forwarded (the commit
        overlaps the upstream call) and awaited before the first byte of its reply goes to the
        client. A store failure is kept in `lost` (the turn's end raises it), never raised here."""
        if self._durable is None:

            async def step() -> None:
                try:
                    await self.store.flush(self.key)
                except ProxyError as exc:
                    self.lost = exc

            self._durable = self._then(step)
        return self._durable

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
        if self.lost is not None:  # its items never reached the store: nothing to end there
            raise self.lost
        hashes = await off_loop(sum(_size(raw) for raw in reply), lambda: [self.codec.hash(raw) for raw in reply])
        marks = dict(self.report.marks) if self.report is not None else {}
        async with self.store.lock(self.key):
            conversation = await self.store.get(self.key)
            live = _Live(conversation.live if conversation is not None else [], self.plan.planned_on)
            # Only a request that names its whole branch competes for the live transcript; proxy
            # history's new items are added whatever else ended meanwhile.
            newer = self.plan.branch and conversation is not None and conversation.marks.get(LIVE_ORDER_MARK, 0) > self.order
            if status == LIVE and not newer:
                changes = dict.fromkeys(self.pending, LIVE)
                changes |= dict.fromkeys(self.plan.supersede, SUPERSEDED)
                if self.plan.branch and not live.as_planned:  # live items its request left out: another turn's, accepted meanwhile
                    mine = {*self.plan.known_seqs, *self.pending}
                    changes |= {seq: SUPERSEDED for seq in live.seqs - mine - set(self.plan.supersede)}
                marks[LIVE_ORDER_MARK] = self.order
                if self.report is not None:  # the marks the turn leaves, as the next turn reads them
                    self.report.marks[LIVE_ORDER_MARK] = self.order
            else:
                if status == LIVE:  # a newer turn took the live transcript meanwhile: this one is kept aside
                    status = reply_status = SUPERSEDED
                changes = {seq: status for seq in self.pending if live.as_planned or seq not in live.seqs}
                if newer:
                    marks = {}  # the cuts of a prompt that is no longer the conversation's
            record = self.report.record(status, self.pending) if self.report is not None else None
            try:
                await self.store.finish_turn(
                    self.key, changes, list(zip(reply, hashes, strict=True)), reply_status, record,
                    llm_calls=self.llm_calls, forwarded=self.forwarded, marks=marks or None,
                )
            except KeyError as exc:  # its items are gone: the conversation deleted meanwhile, or
                # staged items a failing store dropped unwritten; the reply still goes out, saying so
                raise StoreUnavailable("This turn's messages are no longer in the store: its reply was not kept.") from exc
            if self.parts is not None and record is not None and conversation is not None:
                self.parts.ended(conversation)
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


class _Live:
    """The live index a turn ends on. `as_planned`: the one it was planned on (full history), so
    no item is live beyond what its request named or superseded, and none of its new items is
    live yet: the usual turn, told without reading the index (it grows with the conversation)."""

    def __init__(self, live: list[tuple[int, str]], planned_on: list[tuple[int, str]] | None) -> None:
        # A snapshot's index is read-only (store/base.py): the embedded store lends the same list
        # while it is unchanged; another store's equal copy is compared in C.
        self.as_planned = planned_on is not None and (live is planned_on or live == planned_on)
        self._live = live
        self._seqs: set[int] | None = None

    @property
    def seqs(self) -> set[int]:
        if self._seqs is None:
            self._seqs = set(map(itemgetter(0), self._live))
        return self._seqs


def _size(raw: Raw) -> int:
    """A cheap lower bound of an item's size: its text fields' lengths."""
    return sum(len(v) for v in raw.values() if isinstance(v, str)) + sum(
        len(p.get("text") or "") for v in raw.values() if isinstance(v, list) for p in v if isinstance(p, dict)
    )
