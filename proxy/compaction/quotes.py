"""What the user said: the user's own messages, carried verbatim by the proxy, not the summarizer.

A summarizer may drop an instruction the user gave twenty turns ago ("never touch legacy/"), and
small models often do. So every user message after the task that a summary covers is kept in the
summary as it was written, carried forward from summary to summary. Past the budget the oldest
are shortened to a head and a ref (read_tool_output reads the whole message back by it); past
even that, the oldest are counted ("N earlier messages") — never dropped without a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..markers import NON_TEXT, neutralised, shortened_quote
from ..store import QuotedMessage
from ..transcript import Role
from .windows import Entry

HEAD_CHARS = 240  # what a shortened message keeps: enough for the gist of an instruction


def quote(seq: int, text: str | None) -> QuotedMessage:
    """A user message as a summary carries it: its whole text (None: it has none, e.g. images)."""
    shown = NON_TEXT if text is None else text
    return QuotedMessage(seq, shown, len(shown))


def quoted_chars(message: QuotedMessage) -> int:
    """The characters `message` takes in the rendered summary (see render.py: a blank line, "- ")."""
    return len(entry_text(message)) + 4


def entry_text(message: QuotedMessage) -> str:
    """A quote as the summary shows it: the user's words (what imitates a proxy note in them
    marked quoted), and where the rest is when shortened."""
    if message.ref is None:
        return neutralised(message.text)
    return neutralised(message.text) + shortened_quote(len(message.text), message.chars, message.ref)


def fit_quotes(
    previous: Iterable[QuotedMessage],
    new: Iterable[QuotedMessage],
    budget: int,
    ref_for: Callable[[int], str],
    previously_omitted: int = 0,
    *,
    keep_newest: bool = True,
) -> tuple[list[QuotedMessage], int]:
    """The quotes a summary carries within `budget` characters, oldest first, and how many of the
    oldest are only counted. Shortens the oldest first (a head and a ref), then counts the oldest
    shortened ones out; the newest always stays (shortened if it must) unless not `keep_newest`."""
    quotes = [*previous, *new]
    omitted = previously_omitted
    total = sum(quoted_chars(q) for q in quotes)
    for i, message in enumerate(quotes):
        if total <= budget:
            break
        if message.ref is None and message.chars > HEAD_CHARS:
            shortened = QuotedMessage(message.seq, message.text[:HEAD_CHARS], message.chars, ref_for(message.seq))
            total += quoted_chars(shortened) - quoted_chars(message)
            quotes[i] = shortened
    dropped = 0
    while total > budget and dropped < len(quotes) - (1 if keep_newest else 0):
        total -= quoted_chars(quotes[dropped])
        dropped += 1
    return quotes[dropped:], omitted + dropped


def quotes_of(window: Sequence[Entry], task_seq: int | None) -> list[QuotedMessage]:
    """The user messages of `window`, the task excepted: it is pinned."""
    return [quote(e.seq, e.text) for e in window if e.role is Role.USER and e.seq != task_seq]


__all__ = ["HEAD_CHARS", "entry_text", "fit_quotes", "quote", "quoted_chars", "quotes_of"]
