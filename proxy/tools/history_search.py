"""`search_history`: the agent's recall of what left its prompt, answered by the proxy itself.

Once any message of the conversation has left the prompt (the window cut it, a compaction
summarized it, mask shortened it, truncation shortened it), the proxy offers two tools together,
the recall tools: `read_tool_output` (readback.py) and `search_history`, which ranks passages
of the conversation's stored live transcript (`Store.search`: BM25 over passages of a few lines,
identifiers matched whole) and shows the best ones with their seq, role, time and, for a tool
output, the ref and offset to read it whole with `read_tool_output`.

Once offered in a conversation they stay offered on every later turn, in the same place with the
same bytes (a mark on the conversation says so): a tool joining or leaving the list changes
every byte after it, and the provider's cached prefix with it. Both join at once, so the list
changes once per conversation, not once per tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ..dialects.base import ToolSpec
from ..identity import ConversationKey
from ..markers import READ_TOOL, SEARCH_TOOL
from ..marks import RECALL_MARK
from ..refs import RefSigner
from ..store import Store
from ..store.search import DEFAULT_HITS, MAX_HITS, SearchHit, terms
from ..transcript import Call, Codec, Item
from .base import ToolContext

SEARCH_TOOL_SPEC = ToolSpec(
    name=SEARCH_TOOL,
    description=(
        "Search this conversation's earlier messages, those no longer shown included, for words or "
        "exact names (a path, id, number). Returns the best passages; a tool output's with its ref."
    ),
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HITS}},
        "required": ["query"],
    },
)

MAX_QUERY_CHARS = 500


def recall_wanted(turn: ToolContext, items: list[Item]) -> bool:
    """Whether the recall tools go with this prompt: they went before in this conversation, or
    something has left the prompt (a shortened output in it, a message left out, a summary)."""
    if turn.marks.recall_tools or RECALL_MARK in turn.report.marks:
        return True
    left = (
        turn.report.messages_left_out > 0 or turn.report.masked > 0 or turn.summary is not None
        or any(item.ref is not None for item in items)
    )
    if left and not turn.dry_run:
        turn.report.marks[RECALL_MARK] = 1  # kept with the turn's end: every later turn offers them too
    return left


def offer(turn: ToolContext, items: list[Item]) -> HistorySearch | None:
    if not recall_wanted(turn, items):
        return None
    return HistorySearch(turn.store, turn.refs, turn.key, turn.codec, lambda text: turn.counter.count_texts([text], turn.model))


class HistorySearch:
    """Answers `search_history` calls from the conversation's stored transcript, for one turn."""

    def __init__(self, store: Store, refs: RefSigner, key: ConversationKey, codec: Codec, measure: Callable[[str], int]) -> None:
        self.store, self.refs, self.key, self.codec, self.measure = store, refs, key, codec, measure
        self.spec = SEARCH_TOOL_SPEC

    async def answer(self, call: Call, room: int | None = None) -> str:
        """The hits for the call's query, as many as fit `room` tokens (None: no bound)."""
        try:
            args = json.loads(call.arguments or "{}")
            query = str(args["query"]).strip()[:MAX_QUERY_CHARS]
            limit = min(max(int(args.get("limit") or DEFAULT_HITS), 1), MAX_HITS)
        except (ValueError, KeyError, TypeError, AttributeError):
            return f'Error: {SEARCH_TOOL} needs JSON arguments {{"query": str, "limit": int}}.'
        if not query:
            return f"Error: {SEARCH_TOOL} needs a non-empty query."
        hits = await self.store.search(self.key, query, limit=limit)
        if not hits:
            return f"[{SEARCH_TOOL}: nothing in this conversation matches {query!r}; try other words or an exact name]"
        heads = [await self._heading(hit) for hit in hits]
        blocks = [f"{head}\n{hit.text}" for head, hit in zip(heads, hits, strict=True)]
        shown = list(blocks)
        while room is not None and shown and self.measure(self._render(query, shown, len(hits))) > room:
            if len(shown) > 1:
                shown.pop()
                continue
            # Even the best passage alone is too long: its lines richest in the query's words, in order.
            best = _best_lines(hits[0].text, query, self.measure, room - self.measure(self._render(query, [heads[0]], len(hits))))
            shown = [f"{heads[0]}\n{best}"] if best else []
            break
        if not shown:
            return f"[{SEARCH_TOOL}: {len(hits)} passages match, but none fits the context window; answer with what you have]"
        return self._render(query, shown, len(hits))

    @staticmethod
    def _render(query: str, blocks: list[str], found: int) -> str:
        cut = "" if len(blocks) == found else f", {found - len(blocks)} more cut to fit the context window"
        return "\n\n".join([f"[{SEARCH_TOOL}: {len(blocks)} passages for {query!r}, most relevant first{cut}]", *blocks])

    async def _heading(self, hit: SearchHit) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(hit.created_at))
        where = f"message seq {hit.seq}, {'tool output' if hit.role == 'tool' else hit.role}, {when}"
        if hit.role == "tool" or len(hit.text) < hit.length:
            offset = await self._offset(hit)
            ref = self.refs.make(self.key, hit.seq)
            where += f'; read it whole: {READ_TOOL}(ref="{ref}", offset={offset}) ({hit.length} characters)'
        return f"({where})"

    async def _offset(self, hit: SearchHit) -> int:
        """Where the passage starts in the text read_tool_output reads (the codec's, which may
        join a message's parts other than the index does)."""
        stored = await self.store.message(self.key, hit.seq)
        if stored is None:
            return hit.offset
        text = self.codec.text(self.codec.items([stored.message], [stored.seq], [stored.hash])[0]) or ""
        at = text.find(hit.text[:200])
        return at if at >= 0 else hit.offset


def _best_lines(text: str, query: str, measure: Callable[[str], int], room: int) -> str:
    """The lines of `text` that share the most words with `query`, kept in their order, as many
    as fit `room` tokens ("" if none does)."""
    wanted = set(terms(query))
    lines = [line for line in text.splitlines() if line.strip()]
    ranked = sorted(range(len(lines)), key=lambda i: -len(wanted.intersection(terms(lines[i]))))
    chosen: list[int] = []
    for i in ranked:
        if measure("\n".join(lines[j] for j in sorted([*chosen, i]))) > room:
            break
        chosen.append(i)
    return "\n".join(lines[j] for j in sorted(chosen))


__all__ = ["SEARCH_TOOL", "SEARCH_TOOL_SPEC", "HistorySearch", "offer", "recall_wanted"]
