"""Which live items a compaction summarizes: pure functions over the items after the boundary.

A window never ends inside a unit (a call and its results, a reasoning item and what it belongs
to: see proxy/transcript.py), so a call is never summarized away while its result stays.
Compaction reads stored items through the conversation's codec, as `Entry`s: the engine's item
and its text, whatever the wire format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import CompactionSettings, TruncationSettings
from ..transcript import Codec, Item, Role

# What a shortened tool output adds beyond its preview: the marker naming its ref.
MARKER_CHARS = 300


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored item as compaction reads it."""

    item: Item
    text: str | None  # the item's text (its codec's reading); None when it has none

    @property
    def seq(self) -> int:
        assert self.item.seq is not None
        return self.item.seq

    @property
    def role(self) -> Role:
        return self.item.role


def entries(codec: Codec, stored: list) -> list[Entry]:
    """Stored messages (Entry) as entries, read by their conversation's codec."""
    items = codec.items([m.message for m in stored], [m.seq for m in stored], [m.hash for m in stored])
    return [Entry(item, codec.text(item)) for item in items]


def turns_window(
    after_boundary: list[Entry], settings: CompactionSettings, force: bool, counted: int = 0
) -> list[Entry]:
    """turns: once N user messages came since the last summary, everything before the newest user
    message (the current turn stays verbatim). `counted`: how many of the first user messages after
    the boundary the last summary already counted (the one that triggered it stays after it)."""
    users = [i for i, m in enumerate(after_boundary) if m.role is Role.USER]
    if not users or (len(users) - counted < settings.turns.every_n_user_messages and not force):
        return []
    return _big_enough(after_boundary[: users[-1]])


def budget_window(
    after_boundary: list[Entry],
    settings: CompactionSettings,
    truncation: TruncationSettings,
    force: bool,
    summary_chars: int = 0,
) -> list[Entry]:
    """budget: once the current summary (`summary_chars`, as sent) plus the live history are over
    `budget.max_history_summary_length` characters (counted as they go upstream, shortened tool outputs
    included), the history's first `budget.compaction_percent`."""
    if not force and summary_chars + history_chars(after_boundary, truncation) <= settings.budget.max_history_summary_length:
        return []
    end = math.ceil(len(after_boundary) * settings.budget.compaction_percent / 100)
    return _big_enough(after_boundary[: block_end(after_boundary, end)])


def block_end(messages: list[Entry], end: int) -> int:
    """Move `end` forward past items that join the one before, so the window keeps a unit whole."""
    while end < len(messages) and messages[end].item.joins:
        end += 1
    return end


def _big_enough(window: list[Entry]) -> list[Entry]:
    return window if len(window) > 2 else []  # two messages or fewer: not worth a summary


def history_chars(messages: list[Entry], truncation: TruncationSettings) -> int:
    total = 0
    for entry in messages:
        chars = len(entry.text or "") + sum(len(call.arguments) for call in entry.item.calls)
        if entry.role is Role.TOOL and truncation.enabled and chars > truncation.max_tool_response_length:
            chars = truncation.preview_length + MARKER_CHARS
        total += chars
    return total
