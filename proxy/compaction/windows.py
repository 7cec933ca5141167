"""Which live messages a compaction summarizes: pure functions over the messages after the boundary.

A window never ends between an assistant `tool_calls` message and its results, so a call is never
summarized away while its result stays (or the other way round).
"""

from __future__ import annotations

import math

from ..config import CompactionSettings, TruncationSettings
from ..messages import text_of
from ..store import StoredMessage

# What a shortened tool output adds beyond its preview: the marker naming its ref.
MARKER_CHARS = 300


def turns_window(
    after_boundary: list[StoredMessage], settings: CompactionSettings, force: bool, counted: int = 0
) -> list[StoredMessage]:
    """turns: once N user messages came since the last summary, everything before the newest user
    message (the current turn stays verbatim). `counted`: how many of the first user messages after
    the boundary the last summary already counted (the one that triggered it stays after it)."""
    users = [i for i, m in enumerate(after_boundary) if m.message.get("role") == "user"]
    if not users or (len(users) - counted < settings.every_n_user_messages and not force):
        return []
    return _big_enough(after_boundary[: users[-1]])


def budget_window(
    after_boundary: list[StoredMessage],
    settings: CompactionSettings,
    truncation: TruncationSettings,
    force: bool,
    summary_chars: int = 0,
) -> list[StoredMessage]:
    """budget: once the current summary (`summary_chars`, as sent) plus the live history are over
    `max_history_summary_length` characters (counted as they go upstream, shortened tool outputs
    included), the history's first `compaction_percent`."""
    if not force and summary_chars + history_chars(after_boundary, truncation) <= settings.max_history_summary_length:
        return []
    end = math.ceil(len(after_boundary) * settings.compaction_percent / 100)
    return _big_enough(after_boundary[: block_end(after_boundary, end)])


def block_end(messages: list[StoredMessage], end: int) -> int:
    """Move `end` forward past any tool results, so the window keeps a call with all its results."""
    while end < len(messages) and messages[end].message.get("role") == "tool":
        end += 1
    return end


def _big_enough(window: list[StoredMessage]) -> list[StoredMessage]:
    return window if len(window) > 2 else []  # two messages or fewer: not worth a summary


def history_chars(messages: list[StoredMessage], truncation: TruncationSettings) -> int:
    total = 0
    for stored in messages:
        msg = stored.message
        chars = len(text_of(msg.get("content")) or "")
        for call in msg.get("tool_calls") or ():
            chars += len((call.get("function") or {}).get("arguments") or "")
        if msg.get("role") == "tool" and truncation.enabled and chars > truncation.max_tool_response_length:
            chars = truncation.preview_length + MARKER_CHARS
        total += chars
    return total
