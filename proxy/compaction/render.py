"""The summary as the upstream sees it: one system message made from the summary's parts.

The one place that turns a `Summary` record into text. Its parts stay data on the record (the
summarizer's text, the key facts, the user's own messages) so that each is carried forward and
budgeted on its own; this function is a pure function of them, so the same summary is sent as
the same bytes on every turn (prompt caches keep hitting).

User messages that no summary covers but the token window leaves out can be passed as
`left_out_user_messages`: they join "What the user said" after the summary's own, within the
same budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..config import CompactionSettings
from ..markers import FACTS_HEADER, NO_SUMMARY_HEADER, QUOTES_HEADER, SUMMARY_HEADER, neutralised
from ..store import QuotedMessage, Summary
from .quotes import entry_text, fit_quotes



@dataclass(frozen=True, slots=True)
class RenderedSummary:
    text: str  # the system message's content
    refs: dict[int, str] = field(default_factory=dict)  # seq -> ref of each shortened user message


def render_summary(
    summary: Summary | None,
    settings: CompactionSettings,
    *,
    left_out_user_messages: Sequence[QuotedMessage] = (),
    ref_for: Callable[[int], str] | None = None,
    quote_budget: int | None = None,
) -> RenderedSummary | None:
    """The system message for `summary` and the user messages the window leaves out (oldest
    first, after the summary's), or None when there is neither. `ref_for(seq)` names a stored
    message; it is needed only with `left_out_user_messages`, which are shortened within
    `settings.user_messages_chars` (or the smaller `quote_budget`, where even the newest may end
    up only counted) together with the summary's own."""
    if summary is None and not left_out_user_messages:
        return None
    quotes = list(summary.user_messages) if summary is not None else []
    omitted = summary.user_messages_omitted if summary is not None else 0
    if left_out_user_messages:
        if ref_for is None:
            raise ValueError("left_out_user_messages need ref_for to shorten them")
        budget = settings.user_messages_chars if quote_budget is None else min(quote_budget, settings.user_messages_chars)
        quotes, omitted = fit_quotes(
            quotes, left_out_user_messages, budget, ref_for, omitted, keep_newest=quote_budget is None
        )
    # The summarizer's text, the facts and the quotes are the client's words, or an LLM's made of
    # them: what imitates the proxy's notes in them is marked quoted, as in the client's items.
    parts = [SUMMARY_HEADER + neutralised(summary.text.strip()) if summary is not None else NO_SUMMARY_HEADER.strip()]
    if summary is not None and summary.facts:
        parts.append(FACTS_HEADER + "\n" + "\n".join(f"- {neutralised(fact.value)}" for fact in summary.facts))
    if quotes or omitted:
        lines = [QUOTES_HEADER]
        if omitted:
            lines.append(f"({omitted} earlier user messages are not shown; the conversation's trajectory keeps them.)")
        parts.append("\n".join(lines) + "".join(f"\n\n- {entry_text(q)}" for q in quotes))
    return RenderedSummary("\n\n".join(parts), {q.seq: q.ref for q in quotes if q.ref is not None})


def rendered_chars(summary: Summary | None, settings: CompactionSettings) -> int:
    """How long the summary's system message is: what it adds to the history sent upstream."""
    rendered = render_summary(summary, settings)
    return len(rendered.text) if rendered is not None else 0


__all__ = ["RenderedSummary", "SUMMARY_HEADER", "render_summary", "rendered_chars"]
