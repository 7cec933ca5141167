"""Stage 3, the token window: the upstream prompt is the leading system/developer items (the
client's, and the compaction summary) plus the most recent history that fits the token limit.

The history kept is a suffix of the items after the system prefix, cut only between units (a
call and its results, a reasoning item and what it belongs to: see proxy/transcript.py). The
newest unit always goes, even when it alone is over the limit. Before it, as in the seed's
context window builder (trimmed history, then the new message), goes the longest run of older
units that fits the rest of the budget and starts on a user item, where one fits; else the
longest that fits and does not start on a tool result. So a user's follow-up after a long tool
loop still comes with the end of that loop, not alone.

The window cuts in steps (`context.window_refill`): while the history from the last cut still
fits, the window starts there, so each prompt extends the previous one byte for byte (provider
prompt caches bill that shared prefix at a tenth); once it does not, the start moves forward so
the history fills only part of the limit, and the new start is kept with the conversation.

What the window leaves out is never lost without a trace: the task (the first user item) and
the client's instructions anywhere in the transcript (system/developer items: Claude Code's
environment block after the task) are pinned right after the system items, in their order, and every user item left out is quoted verbatim in the
summary's note ("What the user said", made even without a summary), within that note's budget.

The limit is the profile's `context.history_token_limit` minus what every call sends besides the
transcript (tool schemas, instructions; the proxy's read tool while a shortened output may go
along), never more than the model's context window minus the
reply's max tokens, the system items and those fixed parts, where the window is known. Items
pinned by compaction (the task) follow the system prefix and are counted against the limit; the
client's instructions later in the transcript are not history and count as the system items do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..compaction.quotes import quote
from ..compaction.render import render_summary
from ..config import Settings
from ..marks import RECALL_MARK, WINDOW_MARK
from ..tokens import CHARS_PER_TOKEN
from ..transcript import Item, Origin, Role, instructions_in, is_instruction, leading_system_count, unit_start, units
from .base import NO_NOTES, Notes, StageRun, Stepped, Turn, passed_through

MAX_PASSES = 4
RECALL_ROOM = 600  # tokens (at most a tenth of the limit) kept free for a recall round once the recall tools go
# The most of the history limit the window's quotes of the user messages it leaves out may take
# (the rest stays for the history itself), turned into characters by the rough rule.
QUOTE_SHARE = 0.25


class TokenWindow:
    name = "window"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        # The window, then what it left out brought back (the task pinned, the user's messages
        # quoted in the note), then the window again with the quotes counted against the limit:
        # the quotes are bounded, so this settles in a pass or two. Should it not have settled
        # by the last pass, what that pass left out is quoted all the same (the prompt may then
        # pass the limit by the difference): a user message never goes without a trace.
        n_system = leading_system_count(items)
        counted = _Counts(turn)
        summary = next((item for item in items[:n_system] if item.origin is Origin.SUMMARY), None)
        summary_tokens = sum(await counted([summary])) if summary is not None else 0
        quoted_tokens = 0  # what the window's quotes add to the summary's note
        quote_budget: int | None = None
        for done in range(1, MAX_PASSES + 1):
            kept, tokens, budget, limit = await self._choose(turn, items, quoted_tokens, counted)
            if quote_budget is None:
                quote_budget = min(turn.profile.compaction.user_messages_chars, int(limit * QUOTE_SHARE * CHARS_PER_TOKEN))
            redone = self._keep_what_it_leaves_out(turn, items, kept, quote_budget)
            if redone is None:
                break
            note = next((item for item in redone[: n_system + 1] if item.origin is Origin.SUMMARY), None)
            note_tokens = sum(await counted([note])) if note is not None else 0
            quoted_tokens = max(note_tokens - summary_tokens, quoted_tokens)  # never less: it settles
            if done == MAX_PASSES:  # no pass chooses again: the window as it stands, with what is new in it
                kept, tokens = await self._carried_over(items, kept, tokens, redone, counted)
            items = redone
        else:
            turn.notes = NO_NOTES  # not settled: the next turn's window is the whole pipeline's
        turn.report.tokens_sent = tokens
        turn.report.token_budget = budget  # the most the prompt may hold, read-back rounds included
        turn.report.messages_left_out += len(items) - len(kept)  # added to: compaction may have left some out
        return [items[i] for i in kept]

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        """New items after a window that sent everything from its start: sent too while they fit
        (the window cuts only when the limit is reached); a cut means the whole pipeline."""
        stepped = run.note.stepped
        if stepped is None or stepped.mark != turn.marks.window_start or not new:
            return None
        if any(item.ref is not None for item in new) and not stepped.with_read_tool:
            return None  # the read tool's schema joins the prompt: the budget changes
        if any(is_instruction(item) for item in new):
            return None  # not history: it counts as the system items do, which the whole pipeline does
        counts = await self._count(turn, new)
        history = stepped.history_tokens + sum(counts)
        if history > stepped.limit or turn.report.tokens_sent is None:
            return None
        turn.report.tokens_sent += sum(counts)
        turn.notes = Notes(stepped=replace(stepped, history_tokens=history))
        return new

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        """Items taken back out of a window that sent everything from its start and reaches back
        before them: the same window without them (a shorter history fits the same limit), their
        tokens taken off. A window that starts among them would start elsewhere without them."""
        stepped = run.note.stepped
        if stepped is None or stepped.mark != turn.marks.window_start:
            return None
        if turn.report.tokens_sent is None:
            return None
        removed = run.before[keep:]
        shorter = passed_through(run, keep)
        if not removed or shorter is None:
            return shorter
        head = leading_system_count(run.before)
        while head < keep and run.before[head].pinned:
            head += 1
        if keep <= head or not shorter.after or shorter.after[-1] is not run.before[keep - 1]:
            return None
        if any(item.ref is not None for item in removed) and not any(item.ref is not None for item in shorter.after):
            return None  # the read tool's schema went with them alone: the budget changes
        if any(is_instruction(item) for item in removed):
            return None  # not counted in the history: the whole pipeline counts it
        tokens = sum(await self._count(turn, removed))
        turn.report.tokens_sent -= tokens
        fewer = replace(stepped, history_tokens=stepped.history_tokens - tokens)
        return StageRun(shorter.before, shorter.after, Notes(stepped=fewer))

    @staticmethod
    async def _carried_over(
        items: list[Item], kept: list[int], tokens: int, redone: list[Item], counted: _Counts
    ) -> tuple[list[int], int]:
        """`kept` (indices into `items`) as indices into `redone`, with the items that are new in
        it (the note, the task pinned): the window as it stands if no later pass chooses again,
        and the tokens it makes."""
        position = {id(item): i for i, item in enumerate(redone)}
        old = {id(item) for item in items}
        moved = sorted({position[id(items[i])] for i in kept if id(items[i]) in position}
                       | {i for i, item in enumerate(redone) if id(item) not in old})
        before = sum(await counted([items[i] for i in kept]))
        after = sum(await counted([redone[i] for i in moved]))
        return moved, tokens - before + after

    async def _choose(
        self, turn: Turn, items: list[Item], quoted_tokens: int, counted: _Counts, recall: bool = False
    ) -> tuple[list[int], int, int, int]:
        """(the indices of the items to send, the tokens they make, the budget of the prompt, the
        history limit before `quoted_tokens` of the window's own quotes are taken from it). With
        `recall`, room is kept for the recall tools whatever the prompt holds."""
        n_system = leading_system_count(items)
        head = n_system
        while head < len(items) and items[head].pinned:
            head += 1
        head_counts = await counted(items[:head])
        # The recall tools go with any prompt that something has left, and stay: their room is
        # kept once they may go (a window that cuts chooses again with it, so they never overflow it).
        recall = recall or _recall_goes(turn, items, range(len(items)))
        fixed = turn.fixed_tokens + (turn.proxy_tool_tokens if recall else 0)
        # ... and room for one of their rounds: a search the window leaves no room for finds nothing.
        room = min(RECALL_ROOM, turn.profile.context.history_token_limit // 10) if recall else 0
        # The client's instructions after the leading system items (Claude Code's environment
        # block after the task) are not history either: they count as those do, against the
        # model's window but not the history limit, so the window cuts nothing for their sake.
        at = instructions_in(items, n_system, len(items))
        instructions = dict(zip(at, await counted([items[i] for i in at]), strict=True))
        limit = effective_limit(
            max(turn.profile.context.history_token_limit - fixed - room, 0),
            turn.counter.context_window(turn.model),
            turn.reply_reserve,
            sum(head_counts[:n_system]) + sum(instructions.values()) + fixed,
        )
        full_limit = limit
        pinned = sum(head_counts[i] for i in range(n_system, head) if i not in instructions)
        limit = max(limit - pinned - quoted_tokens, 0)
        counts, scan_from = await self._tail_counts(items, head, limit + sum(instructions.values()), counted)
        counts[:head] = head_counts
        for i in instructions:
            counts[i] = 0
        kept = self._stepped(turn, items, counts, limit, head, scan_from)
        with_read_tool = recall
        if not recall and len(kept) < len(items):  # the cut makes the recall tools go: their room first
            return await self._choose(turn, items, quoted_tokens, counted, recall=True)
        tokens = fixed + sum(counts[i] for i in kept) + sum(instructions.get(i, 0) for i in kept)
        history = sum(counts[i] for i in kept[head:])
        self._note(turn, items, kept, head, Stepped(None, history, limit, with_read_tool))
        return kept, tokens, tokens + limit + room - history, full_limit

    @staticmethod
    def _note(turn: Turn, items: list[Item], kept: list[int], head: int, stepped: Stepped) -> None:
        """For the next turn's `extend`: a stepped window that sends the whole history from where
        its start now stands (and will stand next turn: the mark names it)."""
        turn.notes = NO_NOTES
        if turn.profile.context.window_refill >= 1 or len(kept) <= head or kept[head:] != list(range(kept[head], len(items))):
            return
        mark = turn.report.marks.get(WINDOW_MARK, turn.marks.window_start)
        if _start_index(items, head, mark) != kept[head]:
            return
        turn.notes = Notes(stepped=replace(stepped, mark=mark))

    @staticmethod
    def _keep_what_it_leaves_out(turn: Turn, items: list[Item], kept: list[int], budget: int) -> list[Item] | None:
        """The user's words are never left out without a trace: a task the window would leave out
        is pinned instead, and the user messages it leaves out are quoted in the summary's note
        (made if there is no summary yet) within `budget` characters, past which the oldest are
        shortened, then only counted. The new items to choose from, or None if nothing changes."""
        n_system = leading_system_count(items)
        head = n_system
        while head < len(items) and items[head].pinned:
            head += 1
        start = next((i for i in kept if i >= head), len(items))
        user = Role.USER  # looked up once (see transcript.Role)
        task = next((i for i in range(n_system, len(items)) if items[i].role is user), None)
        # The task and the client's instructions it would leave out go pinned, in their order,
        # after what is pinned already.
        pin = sorted({*instructions_in(items, head, start), *([task] if task is not None and head <= task < start else [])})
        if pin:
            moved = set(pin)
            rest = [items[i] for i in range(head, len(items)) if i not in moved]
            return [*items[:head], *(items[i].but(pinned=True) for i in pin), *rest]
        left_out = [item for item in items[head:start] if item.role is user and item.seq is not None]
        if not left_out:
            return None
        quotes = [quote(item.seq, turn.codec.text(item)) for item in left_out]  # type: ignore[arg-type]
        rendered = render_summary(
            turn.summary, turn.profile.compaction, left_out_user_messages=quotes,
            ref_for=lambda seq: turn.refs.make(turn.key, seq), quote_budget=budget,
        )
        assert rendered is not None
        ref = next(iter(rendered.refs.values()), None)
        note = turn.codec.system_note(rendered.text).but(ref=ref, origin=Origin.SUMMARY)
        at = next((i for i in range(n_system) if items[i].origin is Origin.SUMMARY), None)
        if at is not None and items[at].raw == note.raw:
            return None  # it holds them already
        if at is not None:
            return [*items[:at], note, *items[at + 1 :]]
        return [*items[:n_system], note, *items[n_system:]]

    @staticmethod
    def _stepped(turn: Turn, items: list[Item], counts: list[int], limit: int, head: int, scan_from: int) -> list[int]:
        """The window, cut in steps: the last cut's start stays while the history from it fits the
        limit; once it does not, a new cut fills `window_refill` of the limit, and is kept."""
        refill = turn.profile.context.window_refill
        if refill >= 1:
            return select_window(items, counts, limit, scan_from=scan_from)
        start = _start_index(items, head, turn.marks.window_start)
        if start is not None and sum(counts[start:]) <= limit:
            return [*range(head), *range(start, len(items))]
        kept = select_window(items, counts, int(limit * refill), scan_from=scan_from)
        first = next((items[i].seq for i in kept[head:] if items[i].seq is not None), None)
        if first is not None and first != turn.marks.window_start:
            turn.report.marks[WINDOW_MARK] = first
        return kept

    @staticmethod
    async def _count(turn: Turn, items: Sequence[Item]) -> list[int]:
        return await turn.counter.count_many_async(
            [i.raw for i in items], turn.model, [i.hash for i in items], parts=turn.codec.counted_parts
        )

    @staticmethod
    async def _tail_counts(items: list[Item], head: int, limit: int, counted: _Counts) -> tuple[list[int], int]:
        """Counts of the newest items only: as many as it takes to pass `limit` (and at least the
        newest unit), counted back from the newest in batches sized from the tokens per item seen
        so far. The window can't reach further back, so a long conversation's turn costs its
        window, not its length, and a new one's first turn tokenizes about `limit` tokens, not its
        whole transcript (tokenizing is most of a first turn's CPU). Returns counts (uncounted
        entries hold a value over `limit`) and the unit boundary from which the window may be chosen."""
        n = len(items)
        start = unit_start(items, n - 1, head) if n > head else n
        tail = await counted(items[start:])
        total = sum(tail)
        while start > head and total <= limit:
            # Four fifths of the items still wanted at the tokens per item seen so far (short of the
            # limit rather than past it: a token past it is tokenized for nothing, one more batch
            # costs only a lookup), and at most four times what is counted: a few items say little.
            wanted = (limit - total) * len(tail) // max(total, 1)
            batch = max(TAIL_BATCH, min(wanted * 4 // 5 + 1, 4 * len(tail)))
            earlier = unit_start(items, max(head, start - batch), head)  # never start inside a unit
            counts = await counted(items[earlier:start])
            tail = counts + tail
            total += sum(counts)
            start = earlier
        return [limit + 1] * start + tail, start


TAIL_BATCH = 4  # the fewest items `_tail_counts` counts at once


class _Counts:
    """The token counts one run of the window looks at, each item's asked of the counter once: a
    cut turn chooses two to four times over mostly the same items (again with the recall tools'
    room, again with the quotes of what it left out), and each look through the counter costs a
    cache look-up per item (its key hashed, a lock). Keyed by the item itself, which is held here
    while the run lasts, so no id is reused meanwhile."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self._known: dict[int, tuple[Item, int]] = {}

    async def __call__(self, items: Sequence[Item]) -> list[int]:
        known = self._known
        missing = [item for item in items if id(item) not in known]
        if missing:
            for item, tokens in zip(missing, await TokenWindow._count(self.turn, missing), strict=True):
                known[id(item)] = (item, tokens)
        return [known[id(item)][1] for item in items]


def _recall_goes(turn: Turn, items: Sequence[Item], kept: Sequence[int]) -> bool:
    """Whether the recall tools go with the prompt of `kept` (as tools/history_search.py decides)."""
    if turn.marks.recall_tools or RECALL_MARK in turn.report.marks or turn.summary is not None:
        return True
    if len(kept) < len(items) or turn.report.messages_left_out > 0 or turn.report.masked > 0:
        return True
    return any(items[i].ref is not None for i in kept)


def _start_index(items: Sequence[Item], head: int, start_seq: int | None) -> int | None:
    """Where the window starts now: the first history item at or after the last cut (the first
    one when there was none), moved back to its unit's start; None if the cut's item is gone."""
    for i in range(head, len(items)):
        seq = items[i].seq
        if start_seq is None or (seq is not None and seq >= start_seq):
            return unit_start(items, i, head)
    return None


def build(settings: Settings) -> TokenWindow:
    # Always in the list: the limit is per request (profile, model).
    return TokenWindow()


def select_window(items: Sequence[Item], counts: Sequence[int], limit: int, scan_from: int = 0) -> list[int]:
    """Indices of the items to send, in order: the leading system items and the pinned items after
    them (neither counted against `limit` here), then the suffix of the rest described in the
    module docstring. Units are looked at from `scan_from` on (a unit boundary the caller knows the
    window cannot reach past). O(len(items) - scan_from)."""
    head = leading_system_count(items)
    while head < len(items) and items[head].pinned:
        head += 1
    blocks = units(items, max(head, scan_from))
    if not blocks:
        return list(range(head))
    newest = len(blocks) - 1
    user_start: int | None = None  # oldest older unit that fits and starts on a user item
    valid_start: int | None = None  # oldest unit that fits and does not start on a tool result
    total = 0
    user, tool = Role.USER, Role.TOOL  # looked up once (see transcript.Role)
    for b in range(newest, -1, -1):
        start, end = blocks[b]
        total += sum(counts[start:end])
        if total > limit:  # counts are >= 0: nothing older fits either
            break
        role = items[start].role
        if role is user and b != newest:  # the newest goes anyway: it starts nothing older
            user_start = b
        if role is not tool:
            valid_start = b
    # Nothing fits (the newest unit alone is over the limit): the newest unit goes alone.
    first = user_start if user_start is not None else valid_start if valid_start is not None else newest
    return [*range(head), *range(blocks[first][0], len(items))]


def effective_limit(history_limit: int, context_window: int | None, reserve: int, fixed_tokens: int) -> int:
    """The history budget: the configured limit, capped by what the model's window leaves."""
    if context_window is None:
        return history_limit
    return max(0, min(history_limit, context_window - reserve - fixed_tokens))
