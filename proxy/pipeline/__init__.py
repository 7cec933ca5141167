"""The context pipeline: an ordered list of stages that rewrite the prompt before it goes upstream.

The list is built once at start-up (`build_pipeline`) and logged; its order is the order of
execution. A stage is one small module in this package with a class named after it. Adding a
stage means adding it to `STAGES` below, never touching the server code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import Settings
from . import compaction, imitations, inbox, knowledge, pairing, quota, truncation, window
from .base import NO_NOTES, Item, Notes, Stage, StageRun, Turn, added, figures_of, moved

__all__ = ["STAGES", "Item", "Notes", "Pipeline", "Stage", "StageRun", "Turn", "build_pipeline"]

# Factories in execution order. Each gets the settings and returns a stage, or None when the
# settings leave it nothing to do.
STAGES: list[Callable[[Settings], Stage | None]] = [
    imitations.build,  # first: what imitates the proxy's notes is marked quoted before the stages add theirs
    truncation.build,  # one huge output must not by itself trigger a compaction
    knowledge.build,  # before compaction: the summary goes after it, the document changes less often
    compaction.build,
    inbox.build,  # after the rewrites of the client's items, before the window that counts its notes
    window.build,
    knowledge.build_refresh,  # right after the window: it says whether the prompt was cut
    quota.build,
    pairing.build,  # last: whatever the stages before did, what goes upstream is well paired
]


class Pipeline:
    """Runs its stages in order; itself a stage, so pipelines compose."""

    name = "pipeline"

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    async def __call__(self, turn: Turn, items: list[Item], done: Sequence[StageRun] = ()) -> list[Item]:
        """Run the stages on `items`; with `done` (the runs of the first stages, which the report's
        figures stand after: see `extend_runs`), the stages after them, on `items` as the last one's
        output."""
        runs = list(done)
        for stage in self.stages[len(runs) :]:
            turn.notes = NO_NOTES
            before, items = items, await stage(turn, items)
            runs.append(StageRun(before, items, turn.notes, figures_of(turn.report)))
        turn.runs = runs
        return items

    async def extend_runs(self, turn: Turn, runs: list[StageRun], new: list[Item]) -> list[Item] | None:
        """The items to send after the previous turn's output, when the input is the previous
        input plus `new` and every stage can tell (see `Extendable`); None: a stage can't (or
        `runs` are those of the first stages only), and `turn.runs` holds the runs of the stages
        before it, extended (what `__call__` may go on from, the report set to the last one's
        figures). The report holds the previous turn's figures, and each stage adds what its new
        items add."""
        if len(runs) > len(self.stages):
            return None
        extended: list[StageRun] = []
        turn.runs = extended
        amounts: dict | None = {}  # what the stages extended so far added to the report's figures
        figures = figures_of(turn.report)
        last_after: list[Item] | None = None  # the previous stage's output, as it was and extended
        last_extended: list[Item] = []
        for stage, run in zip(self.stages, runs, strict=False):
            extend = getattr(stage, "extend", None)
            turn.notes = run.note  # what it does not note again stands
            more = await extend(turn, run, new) if extend is not None else None
            if more is None:
                return None
            figures, was = figures_of(turn.report), figures
            if figures != was:  # most stages add nothing to a later turn's figures
                amounts = _sum(amounts, moved(was, figures))
            # A stage's input is the one before's output (the same list, as __call__ made it):
            # extended by the same items, it is that output extended, not another copy of it.
            before = last_extended if run.before is last_after else run.before + new
            after = before if run.after is run.before and more is new else run.after + more
            extended.append(StageRun(before, after, turn.notes, added(run.figures, amounts)))
            last_after, last_extended = run.after, after
            new = more
        return new if len(extended) == len(self.stages) else None

    async def retract_runs(self, turn: Turn, runs: list[StageRun], keep: int) -> list[StageRun] | None:
        """The previous turn's runs as they would be had its input been its first `keep` items
        (a unit boundary), the report's figures with them, when every stage can tell (see
        `Retractable`); None: a stage can't, and `turn.runs` holds the runs of those before it,
        retracted (to extend, then go on from)."""
        if len(runs) != len(self.stages):
            return None
        retracted: list[StageRun] = []
        turn.runs = retracted
        amounts: dict | None = {}  # what the stages retracted so far took off the report's figures
        figures = figures_of(turn.report)
        for stage, run in zip(self.stages, runs, strict=True):
            retract = getattr(stage, "retract", None)
            shorter = await retract(turn, run, keep) if retract is not None else None
            if shorter is None:
                return None
            figures, was = figures_of(turn.report), figures
            if figures != was:  # most stages take nothing off a later turn's figures
                amounts = _sum(amounts, moved(was, figures))
            retracted.append(StageRun(shorter.before, shorter.after, shorter.note, added(run.figures, amounts)))
            keep = len(shorter.after)  # the next stage's input is this one's output
        return retracted

    def describe(self) -> list[str]:
        return [stage.name for stage in self.stages]


def _sum(amounts: dict | None, more: dict | None) -> dict | None:
    """Two sets of amounts (see `base.moved`) as one; None if either is not known."""
    if amounts is None or more is None:
        return None
    out = dict(amounts)
    for name, amount in more.items():
        if name == "chars_saved":
            saved = dict(out.get(name, {}))
            for stage, chars in amount.items():
                saved[stage] = saved.get(stage, 0) + chars
            out[name] = saved
        else:
            out[name] = out.get(name, 0) + amount
    return out


def build_pipeline(settings: Settings) -> Pipeline:
    return Pipeline([s for factory in STAGES if (s := factory(settings)) is not None])
