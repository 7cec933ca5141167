"""Stage 1, tool-response truncation: a long tool output goes upstream as a preview (or an LLM
summary) plus a marker naming its ref; the full output stays in the conversation log, readable
through `read_tool_output`. Runs first, so one huge output cannot by itself trigger compaction.

Stable: the preview and marker are a pure function of the item, its seq and the quota figures
fixed at its first forwarding; a summary is made once and stored.
"""

from __future__ import annotations

import logging

from ..config import Settings
from ..markers import neutralised, shortened_output
from ..transcript import Item, Role, tool_names
from .base import Notes, StageRun, Turn, item_by_item

log = logging.getLogger("proxy.truncation")
# How far back extend looks for the calls new tool outputs answer (further: the whole pipeline).
CALLS_LOOKED_BACK = 64


class Truncation:
    name = "truncation"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        shortened = await self._shorten(turn, items, items)
        assert shortened is not None  # every call is in `items` itself
        return shortened

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        """Each item is shortened on its own: the new ones are, with the whole input's tool names.
        A summary that failed last turn is tried again on every turn: then the whole pipeline runs."""
        if run.note.summary_failed:
            return None
        return await self._shorten(turn, new, [*run.before[-CALLS_LOOKED_BACK:], *new])

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        """Each item is shortened on its own: the ones taken out take what they saved with them."""
        shorter = None if run.note.summary_failed else item_by_item(run, keep)
        if shorter is None:
            return None
        text = turn.codec.text
        saved = sum(
            len(text(before) or "") - len(text(after) or "")  # a shortened output's text is its preview and marker
            for before, after in zip(run.before[keep:], run.after[keep:], strict=True) if after is not before
        )
        if saved:
            turn.report.saved(self.name, -saved)
        return shorter

    async def _shorten(self, turn: Turn, items: list[Item], context: list[Item]) -> list[Item] | None:
        """`items` with their long tool outputs shortened, naming each output's tool from the calls
        in `context`; None when `context` is only part of the prompt and lacks a call needed."""
        settings = turn.profile.truncation
        if not settings.enabled:
            return items
        names: dict[str, str] | None = None
        long_outputs: list[tuple[int, Item, str, str]] = []  # (position, item, text, tool name)
        tool_result = Role.TOOL  # looked up once (see transcript.Role)
        for position, item in enumerate(items):
            if item.role is not tool_result or item.seq is None:
                continue
            text = turn.codec.text(item)
            if text is None or len(text) <= settings.max_tool_response_length:
                continue
            if names is None:
                names = tool_names(context)
            if (item.answers or "") not in names and context is not items:
                return None
            tool = names.get(item.answers or "", "")
            if settings.tools.get(tool, settings.default) != "keep":
                long_outputs.append((position, item, text, tool))
        if not long_outputs:
            return items

        wanted = [(i, text, tool) for _, i, text, tool in long_outputs if settings.tools.get(tool, settings.default) == "summarize"]
        summaries = await self._summaries(turn, wanted)
        out = list(items)
        for position, item, text, _ in long_outputs:
            assert item.seq is not None
            ref = turn.refs.make(turn.key, item.seq)
            summary = summaries.get(item.seq)
            # (a summary is an LLM's, made of the output: what imitates our notes in it is quoted)
            body = neutralised(summary) if summary is not None else text[: settings.preview_length]
            content = body + self._marker(turn, item.seq, ref, len(text), summary is not None)
            out[position] = turn.codec.with_text(item, content).but(ref=ref)
            turn.report.saved("truncation", len(text) - len(content))
        return out

    def _marker(self, turn: Turn, seq: int, ref: str, total: int, summarized: bool) -> str:
        settings = turn.profile.truncation
        figures = turn.ledger.figures(seq)
        quota = figures.line() if figures is not None else None
        preview = None if summarized else settings.preview_length
        return shortened_output(total, ref, preview, settings.read_length, quota)

    async def _summaries(self, turn: Turn, wanted: list[tuple[Item, str, str]]) -> dict[int, str]:
        """Stored summaries, and new ones made now (a failure falls back to a preview, logged)."""
        if not wanted:
            return {}
        seqs = [item.seq for item, _, _ in wanted if item.seq is not None]
        stored = await turn.store.rewrites(turn.key, seqs)
        made: dict[int, str] = {}
        if turn.dry_run:  # no summarizer call for a count: a preview stands in for a summary not made yet
            return stored
        for item, text, tool in wanted:
            if item.seq is None or item.seq in stored:
                continue
            summary = await turn.summarizer.tool_output(text, tool, turn.model, turn.headers, turn.report.dialect)
            if summary is None:
                turn.report.summaries_failed += 1
                turn.notes = Notes(summary_failed=True)
                continue
            made[item.seq] = summary
        await turn.store.set_rewrites(turn.key, made)
        return {**stored, **made}


def build(settings: Settings) -> Truncation:
    # Always in the list: whether it acts is per request (profiles can turn it on or off).
    return Truncation()
