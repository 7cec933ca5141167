"""The built-in compactor: incremental LLM summaries (`turns` and `budget` strategies).

Incremental: a new summary is made from the previous summary plus only the window after the
boundary, so its cost does not grow with the conversation. A window too big for the
summarizer's own context is folded in chunks, each chunk's summary becoming the next one's
"previous summary". The same window is never summarized twice in a row.
"""

from __future__ import annotations

import logging

from ..config import CompactionSettings
from ..identity import ConversationKey
from ..messages import SYSTEM_ROLES, text_of
from ..store import Store, StoredMessage, Summary
from ..summarizer import Summarizer
from ..tokens import TokenCounter
from .base import CompactionJob
from .facts import missing_facts, with_key_facts
from .windows import budget_window, turns_window

log = logging.getLogger("proxy.compaction")

# A message's text as the summarizer sees it: long tool outputs are cut (their full text stays
# readable through read_tool_output; the summary needs the gist, and key facts catch the ids).
RENDER_TOOL_CHARS = 4000


class LLMCompactor:
    def __init__(self, store: Store, summarizer: Summarizer, counter: TokenCounter) -> None:
        self.store, self.summarizer, self.counter = store, summarizer, counter

    async def get_summary(self, key: ConversationKey) -> Summary | None:
        conversation = await self.store.get(key)
        if conversation is None or conversation.summary_id is None:
            return None
        return await self.store.summary(key, conversation.summary_id)

    async def compact_if_needed(self, job: CompactionJob) -> Summary | None:
        settings = job.profile.compaction
        conversation = await self.store.get(job.key)
        if conversation is None:
            return None
        after = await self.store.messages(job.key, live_only=True, after=conversation.boundary)
        after = [m for m in after if m.message.get("role") not in SYSTEM_ROLES]  # the client resends those
        if settings.strategy == "turns":
            window = turns_window(after, settings, job.force)
        elif settings.strategy == "budget":
            window = budget_window(after, settings, job.profile.truncation, job.force)
        else:
            return None
        if not window:
            return None
        previous = await self.get_summary(job.key)
        if previous is not None and previous.last_seq >= window[-1].seq:
            return None  # this window is already summarized: never the same one twice in a row
        recent = after[len(window) : len(window) + settings.recent_context_messages] if settings.strategy == "budget" else []
        return await self._summarize(job, settings, window, previous, recent)

    async def _summarize(
        self,
        job: CompactionJob,
        settings: CompactionSettings,
        window: list[StoredMessage],
        previous: Summary | None,
        recent: list[StoredMessage],
    ) -> Summary:
        rendered = [render(m) for m in window]
        summary_text = previous.text if previous is not None else None
        spent_in = spent_out = 0
        for chunk in self._chunks(rendered, job.model, settings.max_summarizer_input_tokens):
            prompt = self._prompt(summary_text, chunk, [render(m) for m in recent], job)
            result = await self.summarizer.history(prompt, job.model, job.headers)
            summary_text = result.text
            spent_in += result.tokens_in
            spent_out += result.tokens_out
        assert summary_text is not None
        missing = missing_facts("\n".join(rendered), summary_text, settings.max_key_facts)
        summary = Summary(
            text=with_key_facts(summary_text, missing),
            first_seq=previous.first_seq if previous is not None else window[0].seq,
            last_seq=window[-1].seq,
            strategy=settings.strategy,
            model=job.model,
            tokens_in=spent_in,
            tokens_out=spent_out,
        )
        stored = await self.store.add_summary(job.key, summary)
        log.info(
            "compacted",
            extra={
                "conversation": str(job.key), "summary_id": stored.id, "window": [window[0].seq, window[-1].seq],
                "messages": len(window), "tokens_in": spent_in, "key_facts_added": len(missing),
            },
        )
        return stored

    def _chunks(self, rendered: list[str], model: str, max_tokens: int) -> list[list[str]]:
        """Split the window so each summarizer request fits its model (the prompt and summary aside)."""
        window = self.counter.context_window(model)
        budget = min(max_tokens, window if window is not None else max_tokens) * 3 // 4
        chunks: list[list[str]] = [[]]
        used = 0
        for text, tokens in zip(rendered, self.counter.count_many([{"role": "user", "content": t} for t in rendered], model), strict=True):
            if chunks[-1] and used + tokens > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(text)
            used += tokens
        return chunks

    @staticmethod
    def _prompt(previous: str | None, chunk: list[str], recent: list[str], job: CompactionJob) -> str:
        parts = [f"Previous summary:\n{previous}" if previous else "Previous summary: (none yet)"]
        parts.append("Messages to fold into the summary:\n" + "\n\n".join(chunk))
        if recent:
            parts.append("Recent context after these messages (do not summarize, for orientation only):\n" + "\n\n".join(recent))
        if job.quota is not None:
            parts.append(
                f"LLM call quota: {job.quota.used} of {job.quota.limit} used, {job.quota.remaining} remaining. "
                "If few remain, say in the summary that the agent must finish soon."
            )
        return "\n\n---\n\n".join(parts)


def render(stored: StoredMessage) -> str:
    msg = stored.message
    role = msg.get("role")
    text = text_of(msg.get("content")) or ""
    if role == "tool":
        if len(text) > RENDER_TOOL_CHARS:
            text = text[:RENDER_TOOL_CHARS] + f"\n[... {len(text) - RENDER_TOOL_CHARS} more characters]"
        return f"[tool result {msg.get('tool_call_id')}]\n{text}"
    lines = [f"[{role}]"] + ([text] if text else [])
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        lines.append(f"-> calls {fn.get('name')}({fn.get('arguments')}) as {call.get('id')}")
    return "\n".join(lines)


__all__ = ["LLMCompactor", "render"]
