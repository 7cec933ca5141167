"""How one turn's prompt is made: a PromptBuilder, which the exchange asks for the prompt, the
figures the report keeps of it, and the first upstream call's body, never asking which kind it is.

Two kinds. `WholePipeline` runs every stage on the whole transcript. The fast path's `FastTurn`
(fastpath.py) wraps one: it reuses the previous turn's work where every stage can tell, and
falls back to the pipeline it wraps where one can't. Both make the same prompt, byte for byte
(tests/test_fastpath.py); only the cost differs. Which one a turn gets is FastPath.builder's choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..dialects.base import Dialect, ToolSpec
from ..history import TurnPlan
from ..pipeline import Pipeline, Turn
from ..seqruns import SeqRuns
from ..transcript import Item
from .report import TurnReport

if TYPE_CHECKING:
    from ..telemetry import TurnTrace


class PromptBuilder(Protocol):
    """One turn's prompt: `build` it, read its figures (`sent`, `offer_probe`), make the first
    upstream call's body (`upstream_body`), then `done` once the turn is over."""

    async def build(self, turn: Turn, plan: TurnPlan, pending: Sequence[int], trace: TurnTrace) -> list[Item]:
        """The pipeline's output for this turn (`pending`: the seqs its new items were written
        under); `trace` is told of the pipeline's input."""
        ...

    def sent(self, items: list[Item]) -> tuple[SeqRuns, int]:
        """(the seqs the prompt `items` sends, how many shortened outputs it holds), for the report."""
        ...

    def offer_probe(self, items: list[Item]) -> list[Item]:
        """What the proxy's tool offers (`tools.offered`) need to look at of the prompt `items`."""
        ...

    def upstream_body(self, dialect: Dialect, body: dict[str, Any], items: list[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The first upstream call's body: the prompt `items` and the proxy's `tools` in `body`."""
        ...

    def done(self, turn: Turn, report: TurnReport, ok: bool) -> None:
        """The turn is over (`ok`: it ended well, with no other turn of its conversation beside
        it): keep what the next turn reuses, and say in the report how the prompt was made."""
        ...


class WholePipeline:
    """Every stage on the whole transcript, as on a conversation's first turn. How the prompt
    was made (`none`, and why) is said when it is chosen: see FastPath.builder."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def build(self, turn: Turn, plan: TurnPlan, pending: Sequence[int], trace: TurnTrace) -> list[Item]:
        stored = plan.items(turn.codec, pending)
        trace.transcript(stored)
        return await self.pipeline(turn, stored)

    def sent(self, items: list[Item]) -> tuple[SeqRuns, int]:
        return SeqRuns(i.seq for i in items if i.seq is not None), sum(1 for i in items if i.ref is not None and not i.masked)

    def offer_probe(self, items: list[Item]) -> list[Item]:
        return items

    def upstream_body(self, dialect: Dialect, body: dict[str, Any], items: list[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        return dialect.upstream_body(body, items, tools)

    def done(self, turn: Turn, report: TurnReport, ok: bool) -> None:
        pass
