"""The context pipeline: an ordered list of stages that rewrite the prompt before it goes upstream.

The list is built once at start-up (`build_pipeline`) and logged; its order is the order of
execution. A stage is one small module in this package with a class named after it. Adding a
stage means adding it to `STAGES` below, never touching the server code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import Settings
from . import compaction, inbox, knowledge, pairing, quota, truncation, window
from .base import Item, Stage, StageRun, Turn

__all__ = ["STAGES", "Item", "Pipeline", "Stage", "StageRun", "Turn", "build_pipeline"]

# Factories in execution order. Each gets the settings and returns a stage, or None when the
# settings leave it nothing to do.
STAGES: list[Callable[[Settings], Stage | None]] = [
    truncation.build,  # first: one huge output must not by itself trigger a compaction
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

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        runs = []
        for stage in self.stages:
            before, items = items, await stage(turn, items)
            runs.append(StageRun(before, items, turn.notes.pop(stage.name, None)))
        turn.runs = runs
        return items

    async def extend_runs(self, turn: Turn, runs: list[StageRun], new: list[Item]) -> list[Item] | None:
        """The items to send after the previous turn's output, when the input is the previous
        input plus `new` and every stage can tell (see `Extendable`); None: run the pipeline."""
        if len(runs) != len(self.stages):
            return None
        extended = []
        for stage, run in zip(self.stages, runs, strict=True):
            extend = getattr(stage, "extend", None)
            added = await extend(turn, run, new) if extend is not None else None
            if added is None:
                return None
            before = run.before + new
            after = before if run.after is run.before and added is new else run.after + added
            extended.append(StageRun(before, after, turn.notes.pop(stage.name, run.note)))
            new = added
        turn.runs = extended
        return new

    async def retract_runs(self, turn: Turn, runs: list[StageRun], keep: int) -> list[StageRun] | None:
        """The previous turn's runs as they would be had its input been its first `keep` items
        (a unit boundary), the report's figures with them, when every stage can tell (see
        `Retractable`); None: run the pipeline."""
        if len(runs) != len(self.stages):
            return None
        retracted = []
        for stage, run in zip(self.stages, runs, strict=True):
            retract = getattr(stage, "retract", None)
            shorter = await retract(turn, run, keep) if retract is not None else None
            if shorter is None:
                return None
            retracted.append(shorter)
            keep = len(shorter.after)  # the next stage's input is this one's output
        return retracted

    def describe(self) -> list[str]:
        return [stage.name for stage in self.stages]


def build_pipeline(settings: Settings) -> Pipeline:
    return Pipeline([s for factory in STAGES if (s := factory(settings)) is not None])
