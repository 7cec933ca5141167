"""Stage 3, the token window: the upstream prompt is the leading system/developer messages (the
client's, and the compaction summary) plus the most recent history that fits the token limit.

The history kept is a suffix of the messages after the system prefix. An assistant `tool_calls`
message and the tool results after it form one block: they go in or out together. The newest
block always goes, even when it alone is over the limit. Before it, as in the seed's context
window builder (trimmed history, then the new message), goes the longest run of older blocks
that fits the rest of the budget and starts on a user message, where one fits; else the longest
that fits and does not start on a tool result. So a user's follow-up after a long tool loop
still comes with the end of that loop, not alone.

The limit is the profile's `context.history_token_limit`, never more than the model's context
window minus the reply's `max_tokens` and the system messages, where the window is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import Settings
from ..messages import SYSTEM_ROLES, Message
from .base import Item, Turn


class TokenWindow:
    name = "window"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        model = turn.model
        messages = [item.message for item in items]
        hashes = [item.hash for item in items]
        pinned = turn.notes.get("pinned", 0)  # the task, pinned by compaction right after the summary
        n_system = leading_system_count(messages)
        head = n_system + pinned
        head_counts = await turn.counter.count_many_async(messages[:head], model, hashes[:head])
        limit = effective_limit(
            turn.profile.context.history_token_limit,
            turn.counter.context_window(model),
            reply_reserve(turn.body),
            sum(head_counts[:n_system]),
        )
        limit = max(limit - sum(head_counts[n_system:]), 0)
        counts, scan_from = await self._tail_counts(turn, messages, hashes, head, limit)
        counts[:head] = head_counts
        kept = select_window(messages, counts, limit, pinned=pinned, scan_from=scan_from)
        turn.notes["tokens_sent"] = sum(counts[i] for i in kept)
        left_out = len(items) - len(kept)
        # Added to, not set: an earlier stage (compaction) may have left messages out too.
        turn.notes["messages_left_out"] = turn.notes.get("messages_left_out", 0) + left_out
        return [items[i] for i in kept]

    @staticmethod
    async def _tail_counts(
        turn: Turn, messages: list[Message], hashes: list[str | None], head: int, limit: int
    ) -> tuple[list[int], int]:
        """Counts of the newest messages only: as many as it takes to pass `limit` (and at least the
        newest block), doubling from 64. The window can't reach further back, so a long
        conversation's turn costs its window, not its length. Returns counts (uncounted entries
        hold a value over `limit`) and the block boundary from which the window may be chosen."""
        n = len(messages)
        newest = n - 1
        while newest > head and messages[newest].get("role") == "tool":
            newest -= 1  # the newest block starts at the assistant message its results answer
        size = max(64, n - newest)
        while True:
            start = max(head, n - size)
            while start > head and messages[start].get("role") == "tool":
                start -= 1  # never start inside a call's block
            tail = await turn.counter.count_many_async(messages[start:], turn.model, hashes[start:])
            if start == head or sum(tail) > limit:
                return [limit + 1] * start + tail, start
            size *= 2

def build(settings: Settings) -> TokenWindow:
    # Always in the list: the limit is per request (profile, model).
    return TokenWindow()


def select_window(
    messages: Sequence[Message], counts: Sequence[int], limit: int, pinned: int = 0, scan_from: int = 0
) -> list[int]:
    """Indices of the messages to send, in order: the leading system messages and the `pinned`
    messages after them (neither counted against `limit`), then the suffix of the rest described
    in the module docstring. Blocks are looked at from `scan_from` on (a block boundary the caller
    knows the window cannot reach past). O(len(messages) - scan_from)."""
    n_system = leading_system_count(messages) + pinned
    blocks = history_blocks(messages, max(n_system, scan_from))
    if not blocks:
        return list(range(n_system))
    newest = len(blocks) - 1
    user_start: int | None = None  # oldest older block that fits and starts on a user message
    valid_start: int | None = None  # oldest block that fits and does not start on a tool result
    total = 0
    for b in range(newest, -1, -1):
        start, end = blocks[b]
        total += sum(counts[start:end])
        if total > limit:  # counts are >= 0: nothing older fits either
            break
        role = messages[start].get("role")
        if role == "user" and b != newest:  # the newest goes anyway: it starts nothing older
            user_start = b
        if role != "tool":
            valid_start = b
    # Nothing fits (the newest block alone is over the limit): the newest block goes alone.
    first = user_start if user_start is not None else valid_start if valid_start is not None else newest
    return [*range(n_system), *range(blocks[first][0], len(messages))]


def leading_system_count(messages: Sequence[Message]) -> int:
    for i, msg in enumerate(messages):
        if msg.get("role") not in SYSTEM_ROLES:
            return i
    return len(messages)


def history_blocks(messages: Sequence[Message], start: int) -> list[tuple[int, int]]:
    """[start, end) ranges of messages that go in or out together: an assistant message with
    `tool_calls` and the tool results right after it, or any other single message."""
    blocks: list[tuple[int, int]] = []
    i, n = start, len(messages)
    while i < n:
        j = i + 1
        if messages[i].get("role") == "assistant" and messages[i].get("tool_calls"):
            while j < n and messages[j].get("role") == "tool":
                j += 1
        blocks.append((i, j))
        i = j
    return blocks


def effective_limit(history_limit: int, context_window: int | None, reserve: int, system_tokens: int) -> int:
    """The history budget: the configured limit, capped by what the model's window leaves."""
    if context_window is None:
        return history_limit
    return max(0, min(history_limit, context_window - reserve - system_tokens))


def reply_reserve(body: dict[str, Any]) -> int:
    """Tokens the request reserves for the reply (`max_completion_tokens` / `max_tokens`)."""
    values = [body.get(key) for key in ("max_completion_tokens", "max_tokens")]
    return max((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0), default=0)
