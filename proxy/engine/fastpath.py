"""The fast path: a turn that repeats the previous one and adds items costs only what it adds.

A full-history client resends its last request with new items appended (its previous request,
the reply, a tool result), and the proxy's rewrites are stable: the prompt of a turn is the
previous prompt plus the new items, rewritten, until the window cuts or a summary replaces the
history. So when a request's body extends the conversation's previous one byte for byte
(proxy/prefix.py's BodyCache) and nothing else that decides the prompt changed (the profile,
the conversation's marks and summary, its seqs), each stage is asked to handle the new items
alone (`Stage.extend`); the prompt is the previous one plus what they return. Where the dialect
sends each item as it alone says (chat, Responses: `items_sent_alone`) the upstream body is the
previous one's bytes with the new items' spliced in where its transcript closed; Messages
rebuilds its body from the prompt. Any doubt (a stage that can't tell: a cut, a new summary, an
inbox note, masking, knowledge, a failed summary, a repair; or an edit of the request) means the
whole pipeline, as on the conversation's first turn. A summary in force is no doubt: new items
come after its boundary. The result is the same either way, only its cost differs:
tests/test_fastpath.py proves it byte for byte in every wire format, streamed turns included.

Kept per conversation (least recently used out first, bounded by the bytes of upstream bodies
held), and only after a turn that ended well, once its writes and the marks it moved have
landed (the engine finishes a turn whole even when the client hangs up at a stream's end); a
turn that failed, or a store that is written by someone else meanwhile (another replica, a
compaction: the marks, seqs or summary differ), makes the next turn take the whole path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..config import Profile
from ..dialects.base import Dialect, ToolSpec
from ..history import TurnPlan
from ..identity import ConversationKey
from ..pipeline import Pipeline, StageRun, Turn
from ..prefix import BodyEntry, ParsedBody
from ..transcript import Item, unit_start
from ..upstream import EncodedBody
from .report import TurnReport

# Memory for memos: their upstream bodies and items (the transcript they hold is the BodyCache's:
# a memo goes when its body does, see FastPath.let_go). Measured (bench/memory_breakdown.py):
# 120-250 KB for the bench's agents of 220-400 KB, ~12 KB for its small conversations; 2 MB at
# turn 1,000 of one conversation.
MAX_BYTES = 5 * 2**20  # server.cache_mb / 4
MAX_CONVERSATIONS = 256  # as the BodyCache's MAX_BODIES
ITEM_BYTES = 350  # an Item, its place in each stage's lists, a shortened copy's share
LARGEST = 2  # one memo may take 1/LARGEST of the budget

# What the pipeline's stages fill in of a turn's report: carried from one turn to the next.
# (Not what is the turn's own: the cuts it moved, inbox deliveries, the knowledge shown, repairs
# and failed summaries; a turn with any of those leaves no memo, or takes the whole path.)
PIPELINE_FIELDS = ("tokens_sent", "token_budget", "messages_left_out", "masked", "chars_saved", "summary_id")
_SPLICE = "\x00context-proxy: the transcript goes here\x00"  # never in a JSON body: it has a raw NUL


@dataclass(frozen=True, slots=True)
class Wire:
    """An upstream body as bytes, split where its transcript array closes, and the parts it was
    made of: the previous turn's body is the next one's, its new items spliced in before `tail`."""

    head: bytes  # up to the transcript array's opening bracket
    items: bytes  # the bracket and the items, comma-separated (no closing bracket)
    tail: bytes  # the closing bracket and the rest of the body
    sendable: list[Any]  # the transcript as it went (the dialect's form of each item)
    envelope: dict[str, Any]  # the body, its transcript field holding a placeholder
    tools: tuple[str, ...]  # the proxy's tools it offered
    key: str  # the transcript's field

    @property
    def size(self) -> int:
        return len(self.head) + len(self.items) + len(self.tail)

    def body(self) -> EncodedBody:
        return EncodedBody({**self.envelope, self.key: self.sendable}, self.head + self.items + self.tail)


def wire_of(body: dict[str, Any], key: str) -> Wire | None:
    """`body` (an upstream body made by a dialect) split at its transcript; None if it can't be."""
    sendable = body.get(key)
    if not isinstance(sendable, list) or not sendable:
        return None
    envelope = {**body, key: _SPLICE}
    try:
        encoded = orjson.dumps(envelope)
        items = orjson.dumps(sendable)
    except TypeError:
        return None
    mark = orjson.dumps(_SPLICE)
    at = encoded.find(mark)
    if at < 0 or encoded.find(mark, at + 1) >= 0:
        return None
    return Wire(encoded[:at], items[:-1], b"]" + encoded[at + len(mark) :], sendable, envelope, (), key)


@dataclass(slots=True)
class Memo:
    """What a conversation's last good turn left for the next one."""

    origin: BodyEntry  # the request body it came from
    settings: tuple[Any, ...]  # what besides the items decides the prompt (see FastTurn.settings)
    marks: dict[str, int]  # the conversation's marks after it
    seqs: list[int | None]  # of the pipeline's input items
    items: list[Item]  # the pipeline's input
    runs: list[StageRun]
    figures: dict[str, Any]  # the report's pipeline fields after the pipeline
    sent_seqs: list[int]
    shortened: int
    shortened_item: Item | None  # one shortened item the prompt holds (the read tool's offer looks)
    wire: Wire | None

    @property
    def size(self) -> int:
        return (self.wire.size if self.wire is not None else 0) + ITEM_BYTES * len(self.items)


class FastPath:
    """The memos of recent conversations (see the module docstring)."""

    def __init__(self, enabled: bool = True, max_bytes: int = MAX_BYTES) -> None:
        self.enabled, self.max_bytes = enabled, max_bytes
        self._memos: OrderedDict[ConversationKey, Memo] = OrderedDict()
        self._keys: dict[int, ConversationKey] = {}  # id of a memo's body entry -> its conversation
        self._held = 0
        self.taken = 0  # turns that took the fast path (for tests and the bench)
        self.declined = 0  # turns that had a memo and still ran the whole pipeline

    def turn(
        self, key: ConversationKey, parsed: ParsedBody | None, settings: tuple[Any, ...], encode: bool = True
    ) -> FastTurn | None:
        """This turn's fast path: one that may reuse the conversation's memo, else one that only
        makes the next memo; None when this request can't make one (no body entry to extend).
        `encode`: the upstream sends JSON bytes (HTTP), so the body's bytes are reused too."""
        if not self.enabled or parsed is None or parsed.entry is None:
            self.forget(key)
            return None
        memo = self._memos.get(key)
        if memo is not None and (memo.origin is not parsed.origin or memo.settings != settings):
            memo = None
        if memo is not None:
            self._memos.move_to_end(key)
        return FastTurn(self, key, parsed.entry, settings, memo, encode)

    def keep(self, key: ConversationKey, memo: Memo) -> None:
        self.forget(key)
        if memo.size > self.max_bytes // LARGEST:
            return
        self._memos[key] = memo
        self._keys[id(memo.origin)] = key
        self._held += memo.size
        while self._held > self.max_bytes or len(self._memos) > MAX_CONVERSATIONS:
            evicted_key = next(iter(self._memos))
            self.forget(evicted_key)

    def forget(self, key: ConversationKey) -> None:
        old = self._memos.pop(key, None)
        if old is not None:
            self._held -= old.size
            self._keys.pop(id(old.origin), None)

    def let_go(self, entry: BodyEntry) -> None:
        """The BodyCache let go of `entry`: a memo made from it can never be used again (and must
        not keep its transcript alive)."""
        key = self._keys.get(id(entry))
        if key is not None and (memo := self._memos.get(key)) is not None and memo.origin is entry:
            self.forget(key)


class FastTurn:
    """One turn's use of the fast path: `rewrite` (the prompt), `upstream_body` (its bytes), then
    `done` once the turn ended well, which keeps what the next turn reuses."""

    def __init__(
        self, owner: FastPath, key: ConversationKey, entry: BodyEntry, settings: tuple[Any, ...], memo: Memo | None,
        encode: bool = True,
    ) -> None:
        self.owner, self.key, self.entry, self.settings, self.memo, self.encode = owner, key, entry, settings, memo, encode
        self.taken = False
        self.wire: Wire | None = None
        self._tail: list[Item] = []
        self._items: list[Item] = []
        self._seqs: list[int | None] = []

    @property
    def outcome(self) -> str:
        """How this turn's prompt was made (the metric's label): taken, declined or none."""
        return "taken" if self.taken else "declined" if self.memo is not None else "none"

    @staticmethod
    def settings_of(profile: Profile, model: str, dialect: Dialect, fixed: tuple[Any, ...]) -> tuple[Any, ...]:
        """What decides a prompt besides its items and the conversation's state: the profile, the
        model, and what the request sends besides its transcript (identical when the body extends
        the previous one), here as the figures derived from it."""
        return (profile, model, dialect.name, *fixed)

    async def rewrite(self, turn: Turn, plan: TurnPlan, pending: Sequence[int], pipeline: Pipeline) -> list[Item]:
        """The pipeline's output for this turn: the previous prompt and the new items' rewrites
        when every stage can tell, else the whole pipeline's."""
        codec = turn.codec
        seqs = [*plan.known_seqs, *pending]
        self._seqs = seqs
        memo = self.memo
        if memo is not None and turn.marks == memo.marks and plan.upstream is self.entry.raws:
            tail = await self._extend(turn, plan, seqs, pipeline, memo)
            if tail is not None:
                self.taken = True
                self.owner.taken += 1
                self._tail = tail
                assert turn.runs is not None
                return turn.runs[-1].after
            self.owner.declined += 1
        self._items = items = codec.items(plan.upstream, seqs, plan.upstream_hashes)
        return await pipeline(turn, items)

    async def _extend(self, turn: Turn, plan: TurnPlan, seqs: list[int | None], pipeline: Pipeline, memo: Memo) -> list[Item] | None:
        done = len(memo.items)
        if len(seqs) <= done or seqs[:done] != memo.seqs:
            return None  # a failed turn's items were sent again under new seqs, or nothing is new
        # The new items read in context: from the start of the last unit they may continue.
        start = unit_start(memo.items, done - 1)
        fresh = turn.codec.items(plan.upstream[start:], seqs[start:], plan.upstream_hashes[start:])
        if fresh[: done - start] != memo.items[start:]:
            return None
        new = fresh[done - start :]
        report = turn.report
        before = _figures(report)
        _apply(report, memo.figures)
        tail = await pipeline.extend_runs(turn, memo.runs, new)
        if tail is None:
            _apply(report, before)  # the whole pipeline fills the report from scratch
            turn.notes.clear()
            return None
        self._items = [*memo.items, *new]
        return tail

    @property
    def inputs(self) -> list[Item]:
        """The pipeline's input this turn: the conversation's items as stored, before rewriting."""
        return self._items

    def offer_probe(self, items: list[Item]) -> list[Item]:
        """What the proxy's tool offers need to look at (`tools.offered`): on the fast path, the
        new items and one shortened item of the previous prompt, not the whole prompt."""
        if not self.taken or self.memo is None:
            return items
        return [*([self.memo.shortened_item] if self.memo.shortened_item is not None else []), *self._tail]

    def sent(self, items: list[Item]) -> tuple[list[int], int]:
        """(the seqs the prompt sends, how many shortened outputs it holds), as the report wants them."""
        if self.taken and self.memo is not None:
            tail = self._tail
            return (
                [*self.memo.sent_seqs, *(i.seq for i in tail if i.seq is not None)],
                self.memo.shortened + sum(1 for i in tail if i.ref is not None and not i.masked),
            )
        return [i.seq for i in items if i.seq is not None], sum(1 for i in items if i.ref is not None and not i.masked)

    def upstream_body(self, dialect: Dialect, body: dict[str, Any], items: list[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The first upstream call's body: the previous one with the new items spliced in, when
        the fast path was taken and the same tools go; else made whole (and split for next time)."""
        if not self.encode or not getattr(dialect, "items_sent_alone", False):
            # An upstream that reads the dict (litellm) may edit it; a dialect whose upstream form
            # of an item depends on others (say, a cache breakpoint on the last) can't be spliced.
            return dialect.upstream_body(body, items, tools)
        names = tuple(t.name for t in tools)
        previous = self.memo.wire if self.taken and self.memo is not None else None
        if previous is not None and previous.tools == names:
            added = dialect.upstream_body(body, self._tail, tools)
            sendable = added.get(previous.key)
            if isinstance(sendable, list) and len(sendable) == len(self._tail):
                joined = b",".join(orjson.dumps(x) for x in sendable) if sendable else b""
                wire = Wire(
                    previous.head, previous.items + (b"," + joined if joined else b""), previous.tail,
                    [*previous.sendable, *sendable], previous.envelope, names, previous.key,
                )
                self.wire = wire
                return wire.body()
        made = dialect.upstream_body(body, items, tools)
        wire = wire_of(made, dialect.transcript_key)
        if wire is None:
            return made
        self.wire = Wire(wire.head, wire.items, wire.tail, wire.sendable, wire.envelope, names, wire.key)
        return self.wire.body()

    def done(self, turn: Turn, report: TurnReport, ok: bool) -> None:
        """After the turn: keep what the next one reuses if it ended well, else forget."""
        if not ok or turn.runs is None or report.repairs or report.summaries_failed or report.inbox_delivered:
            self.owner.forget(self.key)
            return
        out = turn.runs[-1].after
        sent_seqs, shortened = self.sent(out)
        if self.taken and self.memo is not None:
            held = self.memo.shortened_item or next((i for i in self._tail if i.ref is not None), None)
        else:
            held = next((i for i in out if i.ref is not None), None)
        self.owner.keep(self.key, Memo(
            origin=self.entry, settings=self.settings, marks={**turn.marks, **report.marks}, seqs=self._seqs,
            items=self._items, runs=turn.runs, figures=_figures(report), sent_seqs=sent_seqs, shortened=shortened,
            shortened_item=held, wire=self.wire,
        ))


def _figures(report: TurnReport) -> dict[str, Any]:
    out = {name: getattr(report, name) for name in PIPELINE_FIELDS}
    out["chars_saved"] = dict(out["chars_saved"])
    return out


def _apply(report: TurnReport, figures: dict[str, Any]) -> None:
    for name, value in figures.items():
        setattr(report, name, dict(value) if isinstance(value, dict) else value)
