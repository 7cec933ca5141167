"""The fast path: a turn that repeats the previous one and adds items costs only what it adds.

A full-history client resends its last request with new items appended (its previous request,
the reply, a tool result), and the proxy's rewrites are stable: the prompt of a turn is the
previous prompt plus the new items, rewritten, until the window cuts or a summary replaces the
history. So when a request's body extends the conversation's previous one byte for byte
(proxy/prefix.py's BodyCache) and nothing else that decides the prompt changed (the profile,
the conversation's marks and summary, its seqs), each stage is asked to handle the new items
alone (`Stage.extend`); the prompt is the previous one plus what they return.

Claude Code sends its last messages again changed: it moves its cache breakpoint to the newest
message, so the one that held it comes back without it (or as a string again). The BodyCache
then parses the body from a separator before them; they are the same stored items (their
hashes, by meaning, say so: the plan gives them their seqs), so each stage takes the unit they
start in back out of its run (`Stage.retract`) and extends it again with that unit made from
the new bytes and the new items. Retract and extend together are exact whatever the bytes are.

The upstream body reuses the previous one's bytes (`Wire`): its elements made of the items
taken out, or that new items may join (Messages: a user message is made of its tool_result
parts; Gemini: a user content of its functionResponse parts), are encoded again, the rest is the
previous bytes; this turn's dialect makes them a body (`Dialect.encoded_body`: Gemini's carries
the URL's model and stream flag, which a body that extends the last one may change). Fields a
client sends new every request (`Dialect.volatile_fields`, Codex's `client_metadata`) go as this
request sends them: the bytes after the transcript are encoded again when they changed.

A stage that can't tell (a cut, a new summary, an inbox note, masking, knowledge, a failed
summary, a repair) runs whole, and so do the stages after it, on what the stages before it made
of the new items: their runs, and the report's figures as they left it (kept on each StageRun),
are reused. Any other doubt (an edit of the request further back) means the whole pipeline, as
on the conversation's first turn. A summary in force is no doubt: new items come after its
boundary. The result is the same either way, only its cost differs: tests/engine/test_fastpath.py
proves it byte for byte in every wire format, streamed turns and moving breakpoints included,
with the turn records' figures.

Kept per conversation (least recently used out first, bounded by the bytes of upstream bodies
held), and only after a turn that ended well, once its writes and the marks it moved have
landed (the engine finishes a turn whole even when the client hangs up at a stream's end); a
turn that failed, or a store that is written by someone else meanwhile (another replica, a
compaction: the marks, seqs or summary differ), makes the next turn take the whole path.

A turn's FastTurn is its PromptBuilder (prompt.py), wrapping the WholePipeline it falls back to;
a turn that can't take the fast path at all gets the WholePipeline itself (`FastPath.builder`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..config import Profile
from ..dialects.base import ByElements, Dialect, ToolSpec
from ..history import TurnPlan
from ..identity import ConversationKey
from ..metrics import Metrics
from ..pipeline import Pipeline, StageRun, Turn
from ..pipeline.base import NO_NOTES, apply_figures, figures_of
from ..prefix import BodyEntry, ParsedBody
from ..seqruns import SeqRuns
from ..tools import standing
from ..transcript import Item, unit_start
from .prompt import PromptBuilder, WholePipeline
from .report import TurnReport
from .request import ParsedRequest

if TYPE_CHECKING:
    from ..telemetry import TurnTrace

# Memory for memos: their upstream bodies and items (the transcript they hold is the BodyCache's:
# a memo goes when its body does, see FastPath.let_go). Measured (bench/memory_breakdown.py):
# 120-250 KB for the bench's agents of 220-400 KB, ~12 KB for its small conversations; 2 MB at
# turn 1,000 of one conversation.
MAX_BYTES = 5 * 2**20  # server.cache_mb / 4
MAX_CONVERSATIONS = 256  # as the BodyCache's MAX_BODIES
ITEM_BYTES = 350  # an Item, its place in each stage's lists, a shortened copy's share
LARGEST = 2  # one memo may take 1/LARGEST of the budget

_SPLICE = "\x00context-proxy: the transcript goes here\x00"  # never in a JSON body: it has a raw NUL


@dataclass(frozen=True, slots=True)
class Wire:
    """An upstream body as bytes, and the transcript elements it holds: the next turn's body is
    these bytes with their last elements made again, or new ones added, where the array closes.

    `encoded[start:end]` is the elements' JSON, comma-separated (orjson's: element by element
    the same bytes as in the whole array), so the bytes of the last k elements are found by
    encoding those again: nothing is kept per element but where it starts in the prompt."""

    encoded: bytes  # the whole body
    start: int  # where its transcript's first element starts (after the opening bracket)
    end: int  # where its transcript array closes (the closing bracket)
    sendable: list[Any]  # the transcript as it went (the dialect's elements)
    firsts: list[int] | None  # the prompt item each element starts at (None: one element per item)
    envelope: dict[str, Any]  # the body, its transcript field holding a placeholder
    tools: tuple[str, ...]  # the proxy's tools it offered
    key: str  # the transcript's field
    breakpoints: int = 0  # cache breakpoints its elements hold (Messages)
    room: int | None = None  # how many they may hold (None: no limit)

    @property
    def size(self) -> int:
        return len(self.encoded) + 8 * len(self.firsts or ())

    def body(self, dialect: Dialect) -> dict[str, Any]:
        """The upstream body these bytes are, as `dialect` (this turn's) makes one."""
        return dialect.encoded_body({**self.envelope, self.key: self.sendable}, self.encoded)

    def with_fields(self, fields: dict[str, Any]) -> Wire:
        """This body with `fields` (outside the transcript, sent as the client sends them: its
        dialect's volatile ones) set anew: the bytes after the transcript encoded again."""
        envelope = {**self.envelope, **fields}
        encoded, mark = orjson.dumps(envelope), orjson.dumps(_SPLICE)
        after = encoded[encoded.find(mark) + len(mark) :]  # one placeholder: wire_of checked
        return Wire(
            self.encoded[: self.end + 1] + after, self.start, self.end, self.sendable, self.firsts, envelope,
            self.tools, self.key, self.breakpoints, self.room,
        )

    def spliced(self, keep: int, sendable: list[Any], firsts: list[int] | None, breakpoints: int = 0) -> Wire:
        """This body with its elements from `keep` on replaced by `sendable` (made of the prompt's
        items from `firsts[0]` on, when firsts are kept)."""
        end = self.end
        if keep < len(self.sendable):  # the bytes of the elements that go: the same encoded again
            end -= len(b",".join(map(orjson.dumps, self.sendable[keep:]))) + (1 if keep else 0)
        joined = b",".join(map(orjson.dumps, sendable))
        comma = b"," if keep and joined else b""
        view = memoryview(self.encoded)
        encoded = b"".join((view[:end], comma, joined, view[self.end :]))
        return Wire(
            encoded, self.start, end + len(comma) + len(joined), self.sendable[:keep] + sendable,
            None if self.firsts is None or firsts is None else self.firsts[:keep] + firsts,
            self.envelope, self.tools, self.key, breakpoints, self.room,
        )


def wire_of(
    body: dict[str, Any], key: str, tools: tuple[str, ...], firsts: list[int] | None = None, breakpoints: int = 0,
    room: int | None = None,
) -> Wire | None:
    """`body` (an upstream body made by a dialect) as a Wire; None if it can't be split at its transcript."""
    sendable = body.get(key)
    if not isinstance(sendable, list) or not sendable:
        return None
    envelope = {**body, key: _SPLICE}
    try:
        encoded = orjson.dumps(envelope)
        # The envelope's bytes with the transcript's in the placeholder's place. Copied: orjson's bytes
        # keep the capacity its buffer grew to (a memo's small body took ~2.4x its length resident).
        whole = bytes(memoryview(orjson.dumps(body)))
    except TypeError:
        return None
    mark = orjson.dumps(_SPLICE)
    at = encoded.find(mark)
    if at < 0 or encoded.find(mark, at + 1) >= 0:
        return None
    after = len(encoded) - at - len(mark)
    end = len(whole) - after  # where the transcript's bytes end
    if not (whole.startswith(encoded[:at]) and whole.endswith(encoded[at + len(mark) :]) and whole[end - 1 : end] == b"]"):
        return None
    return Wire(whole, at + 1, end - 1, sendable, firsts, envelope, tools, key, breakpoints, room)


def _refreshed(wire: Wire, body: dict[str, Any], volatile: frozenset[str]) -> Wire | None:
    """`wire` with the volatile fields `body` sends now (Codex's `client_metadata`, new every
    request), which go upstream as they came; None if `body` sends other ones (made whole)."""
    if [k for k in wire.envelope if k in volatile] != [k for k in body if k in volatile]:
        return None
    fields = {k: body[k] for k in body if k in volatile}
    if all(wire.envelope[k] == v for k, v in fields.items()):
        return wire
    return wire.with_fields(fields)


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
    sent_seqs: SeqRuns
    shortened: int
    shortened_item: Item | None  # one shortened item the prompt holds (the read tool's offer looks)
    wire: Wire | None

    @property
    def size(self) -> int:
        return (self.wire.size if self.wire is not None else 0) + ITEM_BYTES * len(self.items)


def _no_fast_path(request: ParsedRequest, contended: bool) -> str | None:
    """Why this turn can't reuse its conversation's previous turn, before looking: None if it may."""
    if request.history != "full":
        return "proxy_history"
    if request.anchor_seq is not None:
        return "anchored"
    if request.compaction is not None:
        return "compaction_header"
    if contended:
        return "contended"
    return None


class FastPath:
    """The memos of recent conversations (see the module docstring); the turns' fast path counted
    in `metrics` (taken, declined or none, and why not taken)."""

    def __init__(self, metrics: Metrics, enabled: bool = True, max_bytes: int = MAX_BYTES) -> None:
        self.metrics, self.enabled, self.max_bytes = metrics, enabled, max_bytes
        self._memos: OrderedDict[ConversationKey, Memo] = OrderedDict()
        self._keys: dict[int, ConversationKey] = {}  # id of a memo's body entry -> its conversation
        self._held = 0
        self.taken = 0  # turns that took the fast path (for tests and the bench)
        self.declined = 0  # turns that had a memo and still ran the whole pipeline (or the stages from one that declined)
        self.resumed = 0  # of those, the turns whose stages before the one that declined kept their runs
        self.resent = 0  # of the turns taken, those whose request sent its last items again changed
        self.spliced = 0  # upstream bodies made of the previous one's bytes

    def builder(
        self, request: ParsedRequest, key: ConversationKey, turn: Turn, body: dict[str, Any], pipeline: Pipeline,
        *, contended: bool, encode: bool,
    ) -> PromptBuilder:
        """How this turn's prompt is made (of `body`, the request's as it goes upstream): its fast
        path where it may take one (full-history turns one at a time only), else the whole
        pipeline, the report and metrics then saying why not (`none`, with its reason).
        `encode`: the upstream sends JSON bytes (HTTP), so the body's bytes are reused too."""
        whole = WholePipeline(pipeline)
        declined = _no_fast_path(request, contended)
        if declined is None:
            dialect, profile = request.dialect, request.profile
            standing_tools = tuple(spec.name for spec in standing(profile) if not dialect.has_tool(body, spec.name))
            fixed = (turn.reply_reserve, turn.fixed_tokens, turn.proxy_tool_tokens, standing_tools, request.knowledge_namespace)
            fast = self.turn(key, request.parsed, FastTurn.settings_of(profile, turn.model, dialect, fixed), whole, encode)
            if fast is not None:
                return fast
            declined = "no_body_entry"
        else:
            self.forget(key)
        report = turn.report  # every turn says how its prompt was made, and why not the fast way
        report.fast_path, report.fast_path_reason = "none", declined
        self.metrics.child(self.metrics.fast_path, "none").inc()
        self.metrics.child(self.metrics.fast_path_not_taken, declined).inc()
        return whole

    def turn(
        self, key: ConversationKey, parsed: ParsedBody | None, settings: tuple[Any, ...], whole: WholePipeline,
        encode: bool = True,
    ) -> FastTurn | None:
        """This turn's fast path (falling back to `whole`): one that may reuse the conversation's
        memo, else one that only makes the next memo; None when this request can't make one (no
        body entry to extend)."""
        if not self.enabled or parsed is None or parsed.entry is None:
            self.forget(key)
            return None
        memo = self._memos.get(key)
        why = "no_previous_turn" if memo is None else None  # a first turn, or one after a turn that ended badly
        if memo is not None and memo.origin is not parsed.origin:
            memo, why = None, "body_not_extended"  # an edit further back, another parameter, a body read whole
        elif memo is not None and memo.settings != settings:
            memo, why = None, "settings_changed"
        if memo is not None:
            self._memos.move_to_end(key)
        fast = FastTurn(self, key, parsed.entry, settings, memo, whole, encode, parsed.reused)
        fast.why = why
        return fast

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
    """One turn's use of the fast path, a PromptBuilder wrapping the `whole` pipeline: `build`
    (the prompt), `upstream_body` (its bytes), then `done`, which keeps what the next turn
    reuses if the turn ended well."""

    def __init__(
        self, owner: FastPath, key: ConversationKey, entry: BodyEntry, settings: tuple[Any, ...], memo: Memo | None,
        whole: WholePipeline, encode: bool = True, reused: int = 0,
    ) -> None:
        self.owner, self.key, self.entry, self.settings, self.memo, self.encode = owner, key, entry, settings, memo, encode
        self.whole = whole  # what it falls back to
        self.reused = reused  # leading transcript items that are the memo's request's own (the rest: sent again or new)
        self.taken = False
        self.why: str | None = None  # why it was not taken (the metric's reason)
        self.wire: Wire | None = None
        self._tail: list[Item] = []
        self._items: list[Item] = []
        self._seqs: list[int | None] = []
        self._resume: list[StageRun] | None = None  # a stage declined: the runs of those before it, extended
        # What the previous prompt is to this one (its items after `keep` taken back out, see _extend).
        self._base = (
            _Base(memo.sent_seqs, memo.shortened, memo.shortened_item, memo.wire, len(memo.runs[-1].after))
            if memo is not None else None
        )

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

    async def build(self, turn: Turn, plan: TurnPlan, pending: Sequence[int], trace: TurnTrace) -> list[Item]:
        items = await self.rewrite(turn, plan, pending, self.whole.pipeline)
        trace.transcript(self.inputs)
        return items

    async def rewrite(self, turn: Turn, plan: TurnPlan, pending: Sequence[int], pipeline: Pipeline) -> list[Item]:
        """The pipeline's output for this turn: the previous prompt and the new items' rewrites
        when every stage can tell, else the whole pipeline's."""
        codec = turn.codec
        seqs = [*plan.known_seqs, *pending]
        self._seqs = seqs
        memo = self.memo
        if memo is not None and turn.marks != memo.marks:
            self.why = "marks_changed"  # a cut or a mark another writer moved
        elif memo is not None and plan.upstream is not self.entry.raws:
            self.why = "history_differs"
        elif memo is not None:
            tail = await self._extend(turn, plan, seqs, pipeline, memo)
            if tail is not None:
                self.taken = True
                self.owner.taken += 1
                self._tail = tail
                assert turn.runs is not None
                return turn.runs[-1].after
            stages = pipeline.stages
            done = len(turn.runs or self._resume or ())
            self.why = f"declined_by_{stages[done].name}" if done < len(stages) else "declined"
            self.owner.declined += 1
        if self._resume:  # the stages after the one that declined run on what those before it made
            self.owner.resumed += 1
            return await pipeline(turn, self._resume[-1].after, done=self._resume)
        if not self._items:  # else a stage declined once the new items were made: the memo's and them
            self._items = codec.items(plan.upstream, seqs, plan.upstream_hashes)
        return await pipeline(turn, self._items)

    async def _extend(self, turn: Turn, plan: TurnPlan, seqs: list[int | None], pipeline: Pipeline, memo: Memo) -> list[Item] | None:
        done = len(memo.items)
        if len(seqs) <= done or seqs[:done] != memo.seqs:
            return None  # a failed turn's items were sent again under new seqs, or nothing is new
        report = turn.report
        before = figures_of(report)
        apply_figures(report, memo.figures)
        turn.runs = None
        tail = await (self._appended if self.reused >= done else self._resent)(turn, plan, seqs, pipeline, memo)
        if tail is None:
            # A stage declined (a window cut...): the stages before it keep their extended runs,
            # the report as they left it, and the rest run whole; else the whole pipeline, from scratch.
            done_runs = turn.runs
            if done_runs and done_runs[-1].figures is not None:
                self._resume = done_runs
                apply_figures(report, done_runs[-1].figures)
            else:
                apply_figures(report, before)
            turn.notes = NO_NOTES
        return tail

    async def _appended(
        self, turn: Turn, plan: TurnPlan, seqs: list[int | None], pipeline: Pipeline, memo: Memo
    ) -> list[Item] | None:
        """The request is the previous one plus new items: the stages extend their runs with them."""
        done = len(memo.items)
        # The new items read in context: from the start of the last unit they may continue.
        start = unit_start(memo.items, done - 1)
        fresh = turn.codec.items(plan.upstream[start:], seqs[start:], plan.upstream_hashes[start:])
        if fresh[: done - start] != memo.items[start:]:
            return None
        new = fresh[done - start :]
        # The whole input, whether the stages extend their runs or one declines (a window cut: the
        # whole pipeline then runs on these, not on 200 items made again, ~1 ms of a cut turn).
        self._items = [*memo.items, *new]
        return await pipeline.extend_runs(turn, memo.runs, new)

    async def _resent(
        self, turn: Turn, plan: TurnPlan, seqs: list[int | None], pipeline: Pipeline, memo: Memo
    ) -> list[Item] | None:
        """The request sends the previous one's last items again, changed but the same stored
        items (their seqs say so: Claude Code's breakpoint moved off them), and new items after
        them: the unit they start in is taken back out of every stage's run, and made again
        from the new bytes with the new items. Everything before it is reused."""
        keep = unit_start(memo.items, self.reused)
        runs = await pipeline.retract_runs(turn, memo.runs, keep)
        new = turn.codec.items(plan.upstream[keep:], seqs[keep:], plan.upstream_hashes[keep:])
        self._items = [*memo.items[:keep], *new]  # the whole input, as in _appended
        if runs is None:  # a stage can't: those before it go on with the new items, the rest run whole
            if turn.runs:
                await pipeline.extend_runs(turn, turn.runs, new)
            return None
        base = self._base
        assert base is not None
        # What the previous prompt sent of them goes too: it ended with them (the window sent its whole history).
        gone = memo.runs[-1].after[len(runs[-1].after) :]
        gone_seqs = [i.seq for i in gone if i.seq is not None]
        if gone_seqs and base.sent_seqs.last(len(gone_seqs)) != gone_seqs:
            turn.runs = None  # the whole pipeline
            return None
        tail = await pipeline.extend_runs(turn, runs, new)
        if tail is None:
            return None
        self.owner.resent += 1
        held = base.shortened_item
        self._base = _Base(
            base.sent_seqs.without_last(len(gone_seqs)),
            base.shortened - sum(1 for i in gone if i.ref is not None and not i.masked),
            None if any(i is held for i in gone) else held,
            base.wire,  # its elements made of the items taken out are made again
            len(runs[-1].after),
        )
        return tail

    @property
    def inputs(self) -> list[Item]:
        """The pipeline's input this turn: the conversation's items as stored, before rewriting."""
        return self._items

    def offer_probe(self, items: list[Item]) -> list[Item]:
        """What the proxy's tool offers need to look at (`tools.offered`): on the fast path, the
        new items and one shortened item of the previous prompt, not the whole prompt."""
        if not self.taken or self._base is None:
            return items
        return [*([self._base.shortened_item] if self._base.shortened_item is not None else []), *self._tail]

    def sent(self, items: list[Item]) -> tuple[SeqRuns, int]:
        """(the seqs the prompt sends, how many shortened outputs it holds), as the report wants them."""
        if self.taken and self._base is not None:
            tail = self._tail
            return (
                self._base.sent_seqs.plus(i.seq for i in tail if i.seq is not None),
                self._base.shortened + sum(1 for i in tail if i.ref is not None and not i.masked),
            )
        return self.whole.sent(items)

    def upstream_body(self, dialect: Dialect, body: dict[str, Any], items: list[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The first upstream call's body: the previous one's bytes with its last elements made
        again from the new items (or the new items' added), when the fast path was taken and the
        same tools go; else made whole (and kept for next time)."""
        alone = dialect.items_sent_alone
        by_elements = None if alone else dialect.by_elements()
        if not self.encode or not (alone or by_elements is not None):
            # An upstream that reads the dict (litellm) may edit it.
            return self.whole.upstream_body(dialect, body, items, tools)
        names = tuple(t.name for t in tools)
        base = self._base
        previous = base.wire if self.taken and base is not None else None
        if previous is not None and dialect.volatile_fields:
            previous = _refreshed(previous, body, dialect.volatile_fields)
        if previous is not None and previous.tools == names and base is not None:
            if by_elements is None:
                wire = self._spliced(dialect, body, items, tools, previous, base.prompt)
            else:
                wire = self._rebuilt(by_elements, items, previous, base.prompt)
            if wire is not None:
                self.wire = wire
                self.owner.spliced += 1
                return wire.body(dialect)
        if by_elements is None:
            made, elements = dialect.upstream_body(body, items, tools), None
        else:
            made, elements = by_elements.upstream_body_elements(body, items, tools)
            if elements is None:
                return made
        marked = (elements.firsts, elements.breakpoints, elements.room) if elements is not None else ()
        self.wire = wire_of(made, dialect.transcript_key, names, *marked)
        return self.wire.body(dialect) if self.wire is not None else made

    @staticmethod
    def _spliced(
        dialect: Dialect, body: dict[str, Any], items: list[Item], tools: Sequence[ToolSpec], previous: Wire, cut: int
    ) -> Wire | None:
        """Each item its own element (chat, Responses): the elements from `cut` on go, the new items' come."""
        tail = items[cut:]
        sendable = dialect.upstream_body(body, tail, tools).get(previous.key)
        if not isinstance(sendable, list) or len(sendable) != len(tail) or cut > len(previous.sendable):
            return None
        return previous.spliced(cut, sendable, None)

    @staticmethod
    def _rebuilt(dialect: ByElements, items: list[Item], previous: Wire, cut: int) -> Wire | None:
        """Elements made of several items (Messages): the one that holds the prompt's item
        before `cut` is made again with what follows, as new items may join it."""
        firsts = previous.firsts
        if firsts is None or cut < 1:
            return None
        keep = bisect_right(firsts, cut - 1) - 1
        if keep < 1:
            return None  # the prompt's start is made whole (it may need a note first)
        elements = dialect.upstream_elements(items[firsts[keep] :])
        if elements is None:
            return None
        breakpoints = previous.breakpoints - dialect.breakpoints(previous.sendable[keep:]) + elements.breakpoints
        if previous.room is not None and breakpoints > previous.room:
            return None  # some would have to be taken off: the body is made whole
        return previous.spliced(keep, elements.sendable, [firsts[keep] + f for f in elements.firsts], breakpoints)

    def done(self, turn: Turn, report: TurnReport, ok: bool) -> None:
        """After the turn: keep what the next one reuses if it ended well, else forget; then the
        report and metrics say whether it was taken (and why not)."""
        self._keep(turn, report, ok)
        report.fast_path = self.outcome
        metrics = self.owner.metrics
        metrics.child(metrics.fast_path, self.outcome).inc()
        if not self.taken:
            report.fast_path_reason = self.why or "declined"
            metrics.child(metrics.fast_path_not_taken, report.fast_path_reason).inc()

    def _keep(self, turn: Turn, report: TurnReport, ok: bool) -> None:
        if not ok or turn.runs is None or report.repairs or report.summaries_failed or report.inbox_delivered:
            self.owner.forget(self.key)
            return
        out = turn.runs[-1].after
        sent_seqs, shortened = self.sent(out)
        if self.taken and self._base is not None:
            held = self._base.shortened_item or next((i for i in self._tail if i.ref is not None), None)
        else:
            held = next((i for i in out if i.ref is not None), None)
        self.owner.keep(self.key, Memo(
            origin=self.entry, settings=self.settings, marks=turn.marks.after(report.marks), seqs=self._seqs,
            items=self._items, runs=turn.runs, figures=figures_of(report), sent_seqs=sent_seqs, shortened=shortened,
            shortened_item=held, wire=self.wire,
        ))


@dataclass(frozen=True, slots=True)
class _Base:
    """What this turn's prompt builds on: the previous prompt's (see Memo), less any items taken back out."""

    sent_seqs: SeqRuns
    shortened: int
    shortened_item: Item | None
    wire: Wire | None
    prompt: int  # the prompt's items the wire's elements were made of (the rest: this turn's)

