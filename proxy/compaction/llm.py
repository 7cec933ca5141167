"""The built-in compactor: incremental LLM summaries (`turns` and `budget` strategies).

Incremental: a new summary is made from the previous summary plus only the window after the
boundary, so its cost does not grow with the conversation. A window too big for the
summarizer's own context is folded in chunks, each chunk's summary becoming the next one's
"previous summary"; every request fits the summarizer's window (with a margin where tiktoken
does not know the model's tokenizer), and one refused as too long anyway is split and sent again
at once. The same window is never summarized twice in a row.

Besides the summarizer's text a summary keeps, as data, the window's key facts (facts.py) and the
user's own messages (quotes.py), both carried forward; render.py makes the message of them all.
The summarizer's text is cut to `max_summary_tokens`; with `budget`, the whole summary is kept
small enough that it and the history after it do not trigger the next compaction at once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ..config import CompactionSettings, TruncationSettings
from ..identity import ConversationKey
from ..markers import cut_note, tool_result_label
from ..refs import RefSigner
from ..store import KeyFact, Store, Summary
from ..summarizer import PromptTooLong, Summarizer, prompt
from ..tokens import TokenCounter, encoding_name
from ..transcript import Role
from .base import CompactionJob
from .facts import carried_facts, key_facts
from .quotes import fit_quotes, quotes_of
from .render import rendered_chars
from .windows import Entry, budget_window, entries, history_chars, turns_window

log = logging.getLogger("proxy.compaction")

# A message's text as the summarizer sees it: long tool outputs are cut to what the agent saw of
# them (truncation's default preview; the full text stays readable through read_tool_output, the
# summary needs the gist, and key facts come from the whole stored output), and so is any message
# longer than a chunk could hold.
RENDER_TOOL_CHARS = 2000
RENDER_MAX_CHARS = 24000
# Share of the summarizer's context window a request may fill: tiktoken counts OpenAI's models
# exactly; another tokenizer and chat template can take a good third more tokens for the same text.
WINDOW_SHARE_TIKTOKEN = 0.9
WINDOW_SHARE_OTHER = 0.7
MIN_CHUNK_TOKENS = 256
MAX_SPLITS = 8  # requests refused as too long, per compaction, before it counts as failed


class LLMCompactor:
    def __init__(self, store: Store, summarizer: Summarizer, counter: TokenCounter) -> None:
        self.store, self.summarizer, self.counter = store, summarizer, counter
        self._refs: RefSigner | None = None

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
        stored = await self.store.messages(job.key, live_only=True, after=conversation.boundary)
        # Read through the conversation's codec; system items aside: the client resends those.
        after = [e for e in entries(job.codec, stored) if e.role is not Role.SYSTEM]
        previous = await self.get_summary(job.key)
        if settings.strategy == "turns":
            # The user message that triggered a turns summary stays after it: already counted.
            counted = 1 if previous is not None and previous.strategy == "turns" else 0
            window = turns_window(after, settings, job.force, counted)
        elif settings.strategy == "budget":
            window = budget_window(after, settings, job.profile.truncation, job.force, rendered_chars(previous, settings))
        else:
            return None
        if not window:
            return None
        if previous is not None and previous.last_seq >= window[-1].seq:
            return None  # this window is already summarized: never the same one twice in a row
        rest = after[len(window) :]
        recent = rest[: settings.budget.recent_context_messages] if settings.strategy == "budget" else []
        summary = await self._summarize(job, settings, window, previous, recent)
        if settings.strategy == "budget":
            summary = await self._within_budget(summary, settings, job.profile.truncation, rest, job.key)
        stored = await self.store.add_summary(job.key, summary)
        log.info(
            "compacted",
            extra={
                "conversation": str(job.key), "summary_id": stored.id, "window": [window[0].seq, window[-1].seq],
                "messages": len(window), "tokens_in": stored.tokens_in, "key_facts": len(stored.facts),
                "user_messages": len(stored.user_messages), "chars": rendered_chars(stored, settings),
            },
        )
        return stored

    async def _summarize(
        self,
        job: CompactionJob,
        settings: CompactionSettings,
        window: list[Entry],
        previous: Summary | None,
        recent: list[Entry],
    ) -> Summary:
        text, tokens_in, tokens_out = await self._summary_text(job, settings, window, previous, recent)
        ref_for = await self._ref_maker(job.key)
        task_seq = _task_seq(window) if previous is None else None
        quotes, omitted = fit_quotes(
            previous.user_messages if previous is not None else (),
            quotes_of(window, task_seq),
            settings.user_messages_chars,
            ref_for,
            previous.user_messages_omitted if previous is not None else 0,
        )
        candidates = self._candidates(window, previous)
        shown = "\n".join([text, *(q.text for q in quotes)])
        return Summary(
            text=text,
            first_seq=previous.first_seq if previous is not None else window[0].seq,
            last_seq=window[-1].seq,
            strategy=settings.strategy,
            model=job.model,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            facts=key_facts(candidates, shown, settings.max_key_facts, settings.key_facts_chars),
            user_messages=quotes,
            user_messages_omitted=omitted,
        )

    @staticmethod
    def _candidates(window: list[Entry], previous: Summary | None) -> list[KeyFact]:
        if previous is None:
            return carried_facts(window, (), "", 0)
        # What the previous summary showed (its text and the user's words) may be dropped by the
        # new text or cut from a quote now shortened: those come back as key facts.
        shown_before = "\n".join([previous.text, *(q.text for q in previous.user_messages)])
        return carried_facts(window, previous.facts, shown_before, previous.last_seq)

    async def _summary_text(
        self,
        job: CompactionJob,
        settings: CompactionSettings,
        window: list[Entry],
        previous: Summary | None,
        recent_messages: list[Entry],
    ) -> tuple[str, int, int]:
        """The summarizer's text for the window folded into `previous`, chunk by chunk, cut to
        `max_summary_tokens`; and the tokens spent on it (in, out)."""
        model = job.model
        max_out = self._max_out(settings, model)
        rendered = [render(m) for m in window]
        recent = [render(m) for m in recent_messages]
        text = previous.text if previous is not None else None
        # Fixed parts of every request: the system prompt, and the summary so far (at most max_out
        # once a chunk is folded in).
        fixed = await self._tokens([prompt("history")], model) + max(await self._tokens([text or ""], model), max_out)
        budget = max(self._input_budget(settings, model, max_out) - fixed, MIN_CHUNK_TOKENS)
        recent = await self._fit_recent(recent, model, budget // 4)
        budget = max(budget - await self._tokens(recent, model), MIN_CHUNK_TOKENS)
        queue = deque(await self._chunks(rendered, model, budget))
        spent_in = spent_out = splits = 0
        while queue:
            chunk = queue.popleft()
            request = self._prompt(text, chunk, recent, job)
            try:
                result = await self.summarizer.history(
                    request, model, job.headers, max_out, "\n\n".join([*chunk, *recent]), job.dialect
                )
            except PromptTooLong:
                splits += 1
                if splits > MAX_SPLITS:
                    raise
                queue.extendleft(reversed(_split(chunk)) if recent == [] else [chunk])
                recent = []  # the orientation goes first, then the chunk is halved
                log.info("summarizer request too long: split", extra={"conversation": str(job.key), "splits": splits})
                continue
            text = await self._cut(result.text, max_out, model, job.key)
            spent_in += result.tokens_in
            spent_out += result.tokens_out
        assert text is not None
        return text, spent_in, spent_out

    async def _within_budget(
        self,
        summary: Summary,
        settings: CompactionSettings,
        truncation: TruncationSettings,
        rest: list[Entry],
        key: ConversationKey,
    ) -> Summary:
        """budget: shrink the summary so that it and the history it leaves stay under the trigger
        with a tenth to spare, so the next turn does not compact again at once."""
        limit = settings.budget.max_history_summary_length
        room = max(limit - limit // 10 - history_chars(rest, truncation), limit // 4)
        size = rendered_chars(summary, settings)
        ref_for = await self._ref_maker(key)
        for _ in range(6):
            if size <= room:
                break
            scale = room / size
            quotes, omitted = fit_quotes(
                summary.user_messages, (), int(settings.user_messages_chars * scale), ref_for, summary.user_messages_omitted
            )
            summary = replace(
                summary,
                text=summary.text[: int(len(summary.text) * scale)].rstrip(),
                facts=key_facts(summary.facts, summary.text, settings.max_key_facts, int(settings.key_facts_chars * scale)),
                user_messages=quotes,
                user_messages_omitted=omitted,
            )
            size = rendered_chars(summary, settings)
        return summary

    def _max_out(self, settings: CompactionSettings, model: str) -> int:
        window = self.counter.context_window(model)
        return settings.max_summary_tokens if window is None else min(settings.max_summary_tokens, window // 4)

    def _input_budget(self, settings: CompactionSettings, model: str, max_out: int) -> int:
        """Tokens a summarizer request may hold (the answer's `max_out` aside), by our count."""
        window = self.counter.context_window(model)
        if window is None:
            return settings.max_summarizer_input_tokens
        known = encoding_name(self.counter.aliases.get(model, model)) is not None
        share = WINDOW_SHARE_TIKTOKEN if known else WINDOW_SHARE_OTHER
        return min(settings.max_summarizer_input_tokens, int(window * share) - max_out)

    async def _tokens(self, texts: list[str], model: str) -> int:
        counts = await self.counter.count_many_async([{"role": "user", "content": t} for t in texts], model)
        return sum(counts)

    async def _fit_recent(self, recent: list[str], model: str, budget: int) -> list[str]:
        counts = await self.counter.count_many_async([{"role": "user", "content": t} for t in recent], model)
        kept, used = [], 0
        for text, tokens in zip(recent, counts, strict=True):
            if used + tokens > budget:
                break
            kept.append(text)
            used += tokens
        return kept

    async def _chunks(self, rendered: list[str], model: str, budget: int) -> list[list[str]]:
        """Split the window so each summarizer request fits its model (the prompt and summary aside)."""
        counts = await self.counter.count_many_async([{"role": "user", "content": t} for t in rendered], model)
        chunks: list[list[str]] = [[]]
        used = 0
        for text, tokens in zip(rendered, counts, strict=True):
            if chunks[-1] and used + tokens > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(text)
            used += tokens
        return chunks

    async def _cut(self, text: str, max_tokens: int, model: str, key: ConversationKey) -> str:
        """`text` within `max_tokens` (a model may ignore max_tokens, or count differently): cut at
        a line end where one is near."""
        tokens = await self._tokens([text], model)
        if tokens <= max_tokens:
            return text
        cut = text
        while tokens > max_tokens and cut:
            cut = cut[: int(len(cut) * max_tokens / tokens * 0.95)]
            tokens = await self._tokens([cut], model)
        line_end = cut.rfind("\n")
        if line_end > len(cut) * 0.8:
            cut = cut[:line_end]
        log.info("summary cut to max_summary_tokens", extra={"conversation": str(key), "chars": [len(text), len(cut)]})
        return cut.rstrip()

    async def _ref_maker(self, key: ConversationKey) -> Callable[[int], str]:
        """seq -> the ref read_tool_output reads that message by (a shortened user message)."""
        if self._refs is None:
            self._refs = RefSigner(await self.store.secret())
        refs = self._refs
        return lambda seq: refs.make(key, seq)

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


def _task_seq(window: list[Entry]) -> int | None:
    """The task: the conversation's first user message (pinned by the pipeline, never quoted)."""
    return next((m.seq for m in window if m.role is Role.USER), None)


def _split(chunk: list[str]) -> list[list[str]]:
    """A chunk in two halves; a single message in two halves of its text."""
    if len(chunk) > 1:
        middle = len(chunk) // 2
        return [chunk[:middle], chunk[middle:]]
    text = chunk[0]
    return [[text[: len(text) // 2]], [text[len(text) // 2 :]]]


def render(entry: Entry) -> str:
    """An item as the summarizer reads it: its role and text, its calls; long texts cut."""
    role = entry.role
    text = entry.text or ""
    limit = RENDER_TOOL_CHARS if role is Role.TOOL else RENDER_MAX_CHARS
    if len(text) > limit:
        text = text[:limit] + cut_note(len(text) - limit)
    if role is Role.TOOL:
        return f"{tool_result_label(entry.item.answers)}\n{text}"
    label = role.value if role is not Role.OTHER else str(entry.item.raw.get("type") or "item")
    lines = [f"[{label}]"] + ([text] if text else [])
    for call in entry.item.calls:
        lines.append(f"-> calls {call.name}({call.arguments}) as {call.id}")
    return "\n".join(lines)


__all__ = ["LLMCompactor", "render"]
