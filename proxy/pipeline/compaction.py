"""Stage 2, history compaction, as the upstream sees it.

- `turns` / `budget`: live messages up to the summary's boundary are left out; the summary goes
  upstream as a second system message right after the client's system prompt. The first user
  message (the task) is pinned: always sent, right after the summary.
- `mask` (no LLM): tool outputs older than the newest `keep_tool_outputs` become a one-line
  placeholder naming their ref, still readable through read_tool_output.

The summaries themselves are made by proxy/compaction (after the reply, by default).
"""

from __future__ import annotations

from ..config import Settings
from ..messages import SYSTEM_ROLES, text_of
from ..readback import READ_TOOL
from .base import Item, Turn

SUMMARY_HEADER = "Summary of the earlier part of this conversation (older messages are not shown):\n\n"


class Compaction:
    name = "compaction"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        strategy = turn.profile.compaction.strategy
        if strategy == "mask":
            return self._mask(turn, items)
        if strategy == "off" or turn.summary is None:
            return items
        boundary = turn.summary.last_seq
        n_system = next((i for i, it in enumerate(items) if it.message.get("role") not in SYSTEM_ROLES), len(items))
        rest = items[n_system:]
        task = next((it for it in rest if it.message.get("role") == "user"), None)
        kept = [it for it in rest if it.seq is None or it.seq > boundary]
        pinned = task is not None and task.seq is not None and task.seq <= boundary
        summary = Item({"role": "system", "content": SUMMARY_HEADER + turn.summary.text}, None)
        turn.notes["messages_left_out"] = turn.notes.get("messages_left_out", 0) + len(rest) - len(kept) - pinned
        turn.notes["pinned"] = 1 if pinned else 0
        dropped = sum(len(text_of(it.message.get("content")) or "") for it in rest if it.seq is not None and it.seq <= boundary)
        turn.notes["chars_saved_compaction"] = dropped - len(turn.summary.text)
        return [*items[:n_system], summary, *([task] if pinned else []), *kept]

    def _mask(self, turn: Turn, items: list[Item]) -> list[Item]:
        keep = turn.profile.compaction.keep_tool_outputs
        tool_positions = [i for i, it in enumerate(items) if it.message.get("role") == "tool" and it.seq is not None]
        older = tool_positions[: max(len(tool_positions) - keep, 0)]
        if not older:
            return items
        out = list(items)
        refs = turn.notes.setdefault("truncated", {})
        length = turn.profile.truncation.read_length
        for position in older:
            item = items[position]
            assert item.seq is not None
            ref = turn.refs.make(turn.key, item.seq)
            chars = len(text_of(item.message.get("content")) or "")
            placeholder = (
                f"[context-proxy: older tool output omitted ({chars} characters), ref \"{ref}\". "
                f"Call {READ_TOOL}(ref=\"{ref}\", offset=0, length={length}) to read it.]"
            )
            out[position] = Item({**item.message, "content": placeholder}, item.seq)
            refs[item.seq] = ref
        turn.notes["masked"] = len(older)
        return out


def build(settings: Settings) -> Compaction:
    return Compaction()
