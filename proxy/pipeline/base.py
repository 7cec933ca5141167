"""What a pipeline stage sees and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Profile
from ..identity import ConversationKey
from ..marks import Marks
from ..store import Conversation, Store, Summary
from ..transcript import Codec, Item

if TYPE_CHECKING:
    from ..engine.report import TurnReport
    from ..quota import QuotaLedger
    from ..refs import RefSigner
    from ..summarizer import Summarizer
    from ..tokens import TokenCounter

__all__ = [
    "NO_NOTES", "PIPELINE_FIELDS", "Figures", "Item", "Notes", "Stage", "StageRun", "Stepped", "Turn", "added",
    "apply_figures", "figures_of", "item_by_item", "moved", "passed_through",
]

# What the pipeline's stages fill in of a turn's report (the rest of it is the turn's own: the
# cuts it moved, inbox deliveries, the knowledge shown, repairs and failed summaries).
PIPELINE_FIELDS = ("tokens_sent", "token_budget", "messages_left_out", "masked", "chars_saved", "summary_id")
Figures = dict[str, Any]  # PIPELINE_FIELDS -> value, as a report holds them


@dataclass(frozen=True, slots=True)
class Stepped:
    """Where a stepped window stood after a turn that sent the whole history from its start:
    what the next turn needs to tell whether its new items still fit without a cut."""

    mark: int | None  # the window mark the next turn starts from
    history_tokens: int  # the history sent, from the start on
    limit: int  # the history's budget
    with_read_tool: bool  # whether the recall tools' schemas were counted in (something had left the prompt)


@dataclass(frozen=True, slots=True)
class Notes:
    """What a stage notes of its run on a turn for its own `extend` and `retract` on the
    conversation's next turn: a field for each stage that notes anything. Before each stage the
    pipeline sets `Turn.notes` to NO_NOTES (on `extend`, to the stage's previous run's); a stage
    notes by setting it to a Notes of its own (`Notes(stepped=...)`), which the pipeline keeps
    with the stage's run (`StageRun.note`)."""

    summary_failed: bool = False  # truncation: a tool-output summary failed (the next turn tries it again)
    summary_id: int | None = None  # compaction: the summary its prompt holds
    stepped: Stepped | None = None  # window: it sent the whole history from its start (None: it cut, or did not settle)
    repairs: int = 0  # pairing: the repairs it made


NO_NOTES = Notes()


@dataclass(frozen=True, slots=True)
class StageRun:
    """What one stage did on a turn, kept for the next turn of the conversation (see `Stage.extend`):
    its input, its output, what the stage noted of its own run (`Turn.notes` as it left them), and
    the report's figures once it had run (those of the stages up to it: None when not known), so
    that a turn whose later stage can't extend its run still reuses the runs before it."""

    before: list[Item]
    after: list[Item]
    note: Notes = NO_NOTES
    figures: Figures | None = None


@dataclass(slots=True)
class Turn:
    """One request on its way upstream: read-only context for the stages, and the report they fill."""

    key: ConversationKey
    codec: Codec  # the only way a stage reads or makes an item of this request's wire format
    model: str
    store: Store
    profile: Profile
    counter: TokenCounter
    refs: RefSigner
    ledger: QuotaLedger
    summarizer: Summarizer
    headers: dict[str, str]  # what goes upstream with the request (the summarizer uses the same credentials)
    report: TurnReport
    reply_reserve: int = 0  # tokens the request keeps for the reply (its max tokens)
    fixed_tokens: int = 0  # tokens sent with every call besides the transcript (tool schemas, instructions)
    proxy_tool_tokens: int = 0  # what the proxy's recall tools' definitions add when they are offered
    summary: Summary | None = None  # the conversation's current compaction summary, if any
    marks: Marks = field(default_factory=Marks)  # the conversation's, as its last turn left them (see proxy/marks.py)
    body: dict[str, Any] | None = None  # the request as received (for custom stages); never edited
    conversation: Conversation | None = None  # its record as the turn began (None: its first turn)
    knowledge_namespace: str | None = None  # the long-term knowledge document it uses (None: the default)
    # A dry run (count_tokens: the prompt a turn would send): stages write nothing and call no LLM.
    dry_run: bool = False
    # What the running stage notes of its run for the next turn's `extend`, and the runs.
    notes: Notes = NO_NOTES
    runs: list[StageRun] | None = None


class Stage(Protocol):
    name: str

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        """Runs before every upstream call; returns a new list, never edits `items` or their raws."""


class Extendable(Stage, Protocol):
    """A stage that can run on a turn's new items alone (the fast path, proxy/engine/fastpath.py).

    `extend(turn, run, new)`, where `run` is what the stage did on the conversation's previous
    turn and this turn's input is `run.before + new`, returns the items to put after `run.after`
    so that the result is exactly what `__call__` would return for the whole input (and fills
    the report as `__call__` would, the previous turn's figures standing), or None when it can't
    promise that (a cut, a new summary, ...): then the whole pipeline runs. A stage without
    `extend` always means the whole pipeline.
    """

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None: ...


class Retractable(Stage, Protocol):
    """A stage that can take its last input items back out of a run (the fast path, when a
    client sends its last items again changed: Claude Code's moving cache breakpoint).

    `retract(turn, run, keep)` returns the run `__call__` would have made of `run.before[:keep]`
    this turn (its note included), and takes what those items added out of the report (which
    holds `run`'s figures), or None when it can't promise that: then the whole pipeline runs.
    `keep` is a unit boundary of the pipeline's input. Its `extend` then adds the items again,
    made from the new bytes: retract and extend together are exact, whatever changed."""

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None: ...


def figures_of(report: TurnReport) -> Figures:
    """The report's PIPELINE_FIELDS, as they stand (a copy)."""
    out = {name: getattr(report, name) for name in PIPELINE_FIELDS}
    out["chars_saved"] = dict(out["chars_saved"])
    return out


def apply_figures(report: TurnReport, figures: Figures) -> None:
    for name, value in figures.items():
        setattr(report, name, dict(value) if isinstance(value, dict) else value)


def moved(before: Figures, after: Figures) -> Figures | None:
    """What changed from `before` to `after`, as amounts to add (chars_saved: by stage); None
    when a change is no amount (a figure set from or to None)."""
    out: Figures = {}
    for name in PIPELINE_FIELDS:
        old, new = before[name], after[name]
        if new == old:
            continue
        if name == "chars_saved":
            out[name] = {k: new.get(k, 0) - old.get(k, 0) for k in {*old, *new} if new.get(k, 0) != old.get(k, 0)}
        elif isinstance(old, int) and isinstance(new, int):
            out[name] = new - old
        else:
            return None
    return out


def added(figures: Figures | None, amounts: Figures | None) -> Figures | None:
    """`figures` with `amounts` (see `moved`) added; None if either is not known."""
    if figures is None or amounts is None:
        return None
    if not amounts:
        return figures
    out = dict(figures)
    for name, amount in amounts.items():
        if name == "chars_saved":
            saved = dict(out[name])
            for stage, chars in amount.items():
                saved[stage] = saved.get(stage, 0) + chars
            out[name] = saved
        elif isinstance(out[name], int):
            out[name] += amount
        else:
            return None
    return out


def passed_through(run: StageRun, keep: int) -> StageRun | None:
    """`run` without its input's items from `keep` on, for a stage that let them through as
    they were, last in its output (as it lets new items through): None when its output does
    not end with them."""
    removed = len(run.before) - keep
    if removed <= 0:
        return run
    before = run.before[:keep]
    if run.after is run.before:
        return StageRun(before, before, run.note)
    cut = len(run.after) - removed
    after = run.after
    if cut < 0 or any(a is not b for a, b in zip(after[cut:], run.before[keep:], strict=True)):
        return None
    return StageRun(before, after[:cut], run.note)


def item_by_item(run: StageRun, keep: int) -> StageRun | None:
    """`run` without its input's items from `keep` on, for a stage whose output is its input's
    items, one for one (each rewritten on its own, or not)."""
    if run.after is run.before:
        return passed_through(run, keep)
    if len(run.after) != len(run.before):
        return None
    return StageRun(run.before[:keep], run.after[:keep], run.note)
