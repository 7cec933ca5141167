"""Stage 2, history compaction, as the upstream sees it.

- `turns` / `budget`: live items up to the summary's boundary are left out; the summary goes
  upstream as an instruction of the proxy's own right after the client's system prompt. The first
  user item (the task, with the items that join it) and the client's instructions the summary
  covers (system/developer items anywhere in the transcript) are pinned: always sent, right after
  the summary.
- `mask` (no LLM): tool outputs older than the newest `mask.keep_tool_outputs` become a one-line
  placeholder naming their ref, still readable through read_tool_output; they are masked in
  batches of `mask.batch`, so the prompt changes once a batch instead of every turn.

The summaries themselves are made by proxy/compaction (after the reply, by default).
"""

from __future__ import annotations

from ..compaction.render import render_summary
from ..config import Settings
from ..markers import omitted_output
from ..marks import MASK_MARK
from ..transcript import Item, Origin, Role, first_user, is_instruction, leading_system_count, unit_end
from .base import Notes, StageRun, Turn, passed_through


class Compaction:
    name = "compaction"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        strategy = turn.profile.compaction.strategy
        turn.notes = Notes(summary_id=turn.summary.id if turn.summary is not None else None)
        if strategy == "mask":
            return self._mask(turn, items)
        if strategy == "off" or turn.summary is None:
            return items
        boundary = turn.summary.last_seq
        n_system = leading_system_count(items)
        rest = items[n_system:]
        task_at = first_user(rest)
        # The task with what joins it (Claude Code's environment notes), where the summary covers it.
        task = range(task_at, unit_end(rest, task_at + 1)) if task_at is not None else range(0)
        # ... and the client's instructions it covers (instructions are not history: never summarized away).
        head = [
            it.but(pinned=True) for k, it in enumerate(rest)
            if it.seq is not None and it.seq <= boundary and (k in task or is_instruction(it))
        ]
        kept = [it for it in rest if it.seq is None or it.seq > boundary]
        rendered = render_summary(turn.summary, turn.profile.compaction)
        assert rendered is not None
        # A shortened user message in it reads back by ref: the item carries one, so the read tool goes too.
        ref = next(iter(rendered.refs.values()), None)
        summary = turn.codec.system_note(rendered.text).but(ref=ref, origin=Origin.SUMMARY)
        turn.report.messages_left_out += len(rest) - len(kept) - len(head)
        turn.report.summary_id = turn.summary.id
        dropped = sum(len(turn.codec.text(it) or "") for it in rest if it.seq is not None and it.seq <= boundary)
        turn.report.saved("compaction", dropped - len(rendered.text))
        return [*items[:n_system], summary, *head, *kept]

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        """New items come after any summary's boundary: they go as they are, while the summary is
        the same one (a new one replaces the history: the whole pipeline). Masking: the whole
        pipeline, which decides whether its mark moves."""
        strategy = turn.profile.compaction.strategy
        summary_id = turn.summary.id if turn.summary is not None else None
        if strategy == "mask" or summary_id != run.note.summary_id:
            return None
        if strategy == "off" or turn.summary is None:
            return new
        boundary = turn.summary.last_seq
        return new if all(item.seq is None or item.seq > boundary for item in new) else None

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        """Items after any summary's boundary went through as they were: they come out the same
        way, while the summary is the same one (masking: the whole pipeline)."""
        strategy = turn.profile.compaction.strategy
        summary_id = turn.summary.id if turn.summary is not None else None
        if strategy == "mask" or summary_id != run.note.summary_id:
            return None
        if strategy != "off" and turn.summary is not None:
            boundary = turn.summary.last_seq
            if any(item.seq is not None and item.seq <= boundary for item in run.before[keep:]):
                return None
        return passed_through(run, keep)

    def _mask(self, turn: Turn, items: list[Item]) -> list[Item]:
        """Outputs up to the mask mark are placeholders; once `keep + batch` outputs are past it,
        the mark moves so that only the newest `keep` stay whole (in batches: cache-friendly)."""
        settings = turn.profile.compaction
        keep = settings.mask.keep_tool_outputs
        tool = Role.TOOL  # looked up once (see transcript.Role)
        tool_positions = [i for i, it in enumerate(items) if it.role is tool and it.seq is not None]
        through = turn.marks.mask_through
        unmasked = [i for i in tool_positions if items[i].seq > through]  # type: ignore[operator]
        if len(unmasked) >= keep + settings.mask.batch:
            through = items[unmasked[len(unmasked) - keep - 1]].seq  # type: ignore[assignment]
            turn.report.marks[MASK_MARK] = through
        older = [i for i in tool_positions if items[i].seq <= through]  # type: ignore[operator]
        if not older:
            return items
        out = list(items)
        length = turn.profile.truncation.read_length
        for position in older:
            item = items[position]
            assert item.seq is not None
            ref = turn.refs.make(turn.key, item.seq)
            chars = len(turn.codec.text(item) or "")
            out[position] = turn.codec.with_text(item, omitted_output(chars, ref, length)).but(ref=ref, masked=True)
        turn.report.masked = len(older)
        return out


def build(settings: Settings) -> Compaction:
    return Compaction()
