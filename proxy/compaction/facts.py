"""Key facts: the identifiers a summary must not lose.

Summaries are lossy, and the losses that hurt an agent most are exact names: a file path, a URL,
an id, a sha, a number. After each summary the proxy looks for the window's identifiers in it and
keeps the missing ones as a "Key facts" list, carried forward from summary to summary (none of
the seed systems checks its summaries; we do).

What counts, most salient first: an identifier named by the user, the assistant or a tool call's
arguments (files read or edited, URLs fetched, ids looked up) before one seen only inside tool
outputs; then one mentioned in several messages before a once-seen one; then the most recent.
What never counts: parts of timestamps, clock times, dates, durations, sizes, percentages, float
measurements, hex dumps, a log's bare numbers, and the proxy's own markers, refs and call ids
(the proxy's "[... 26000 more characters]" once became a key fact, and the model a made-up ref).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..markers import NOTE_PATTERN
from ..store import KeyFact
from ..transcript import Role
from .windows import Entry

# Spans that are never facts, blanked before identifiers are looked for, so that no part of them
# ("46.403" of "12:04:46.403") survives either.
_NOISE = re.compile(
    "|".join(
        (
            NOTE_PATTERN,  # our markers (shortened outputs, masked outputs, messages)
            r"\[\.\.\. ?[\d,]+ more characters\]",  # our cut marker in the summarizer's prompt
            r"\[tool result [^\]]*\]",  # our render label in the summarizer's prompt
            r"\bout_\d+_[0-9a-f]{24}\b",  # refs
            r"\b(?:call|toolu|fc|resp|msg|rs)_(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{8,}\b(?!\.)",  # call and response ids
            r"\bchatcmpl-[A-Za-z0-9]+",
            # dates and timestamps: 2024-05-12, 2024-05-12T12:04:46.403Z, 12/05/2024
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?",
            r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",
            r"\b\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?\b",  # clock times 12:04, 12:04:46.403
            # durations, sizes, rates and percentages: 412 ms, 1.5s, 3m, 12 KB, 99.5%
            r"\b\d+(?:[.,]\d+)?\s?(?:ns|us|µs|ms|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?"
            r"|[KMGT]i?B|bytes?|[KMG]b?ps|rps|qps)\b",
            r"\b\d+(?:\.\d+)?%",
            r"\b0x[0-9a-fA-F]+\b",  # addresses
            r"(?:^|(?<=\n))[0-9a-fA-F]{6,8}:(?:[ \t]+[0-9a-fA-F]{2,8}){2,}[^\n]*",  # xxd / hexdump lines
            r"(?:\b[0-9a-fA-F]{2}\b[ :]){4,}[0-9a-fA-F]{2}\b",  # byte runs: de ad be ef ...
            r"(?<![\w.])\d+\.\d+(?![\w.])",  # float measurements (a version has two dots or a v)
        )
    )
)

_NAMES = (
    re.compile(r"https?://[^\s<>\"'`)\]}]+"),  # URLs
    re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"),  # e-mail addresses
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),  # UUIDs
    # paths: absolute, ./ ~/ relative, two or more slashes, or one slash and a file extension
    re.compile(r"(?<![\w/.:-])(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@+-]+)+/?"),
    re.compile(r"\b[\w.@+-]+(?:/[\w.@+-]+){2,}/?"),
    re.compile(r"\b[\w@+-][\w.@+-]*(?:/[\w.@+-]+)*/[\w@+-]+\.[A-Za-z][A-Za-z0-9]{0,7}\b"),
    re.compile(
        r"\b[\w-]+\.(?:py|pyi|js|mjs|ts|tsx|jsx|md|json|ya?ml|toml|txt|go|rs|java|kt|c|h|cc|cpp|hpp|rb|php|sh"
        r"|sql|html|css|cfg|ini|lock|log|csv|proto|tf|xml|gradle|swift|scala|ex|exs|vue|svelte)\b"
    ),
    re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"),  # commit shas, digests
    re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b"),  # ticket ids like PROJ-123
    re.compile(r"\bv?\d+(?:\.\d+){2,}(?:[-+][\w.]+)?\b|\bv\d+(?:\.\d+)?\b"),  # versions 2.4.1, v3
    re.compile(r"(?<![\w&])#\d+\b"),  # issue and pull request numbers
)
# Plain numbers count only where a person wrote them (a log's numbers are counters and ids).
_NUMBER = re.compile(r"(?<![\w.#/:=-])[1-9]\d{1,}(?![\w.%/:-])")
# Standards that look like ticket ids.
_NOT_TICKETS = frozenset({"UTF-8", "UTF-16", "UTF-32", "SHA-1", "SHA-256", "SHA-384", "SHA-512", "ISO-8601", "HTTP-2"})
_TRAILING = ".,;:!?'\")]}>"


def identifiers(text: str, *, numbers: bool = True) -> list[str]:
    """Identifiers in `text` in order of first appearance, without duplicates or ones inside
    longer ones; plain numbers too when `numbers` (prose a person wrote)."""
    clean = _NOISE.sub(" ", text)
    found: dict[str, int] = {}  # value -> where it first appears
    for pattern in _NAMES:
        for match in pattern.finditer(clean):
            value = match.group(0).rstrip(_TRAILING)
            if len(value) >= 2 and value not in _NOT_TICKETS:
                found[value] = min(found.get(value, match.start()), match.start())
    # "src/app.py" already carries "app.py": keep the longer form only.
    kept = {v: at for v, at in found.items() if not any(v != other and v in other for other in found)}
    if numbers:
        for match in _NUMBER.finditer(clean):
            kept.setdefault(match.group(0), match.start())
    return sorted(kept, key=kept.__getitem__)


def window_facts(window: Sequence[Entry]) -> dict[str, KeyFact]:
    """Every identifier of the window with its salience, counted once per message, in order of
    first appearance."""
    facts: dict[str, KeyFact] = {}
    for stored in window:
        named, seen = _mentions(stored)
        for value in [*named, *(v for v in seen if v not in named)]:
            fact = facts.get(value)
            if fact is None:
                fact = facts[value] = KeyFact(value, 0, 0, stored.seq)
            if value in named:
                fact.named += 1
            else:
                fact.seen += 1
            fact.last_seq = max(fact.last_seq, stored.seq)
    return facts


def _mentions(entry: Entry) -> tuple[dict[str, None], dict[str, None]]:
    """(identifiers the item names, identifiers it only shows), each in order: a tool output
    shows, the rest names."""
    text = entry.text or ""
    if entry.role is Role.TOOL:
        return {}, dict.fromkeys(identifiers(text, numbers=False))
    named = dict.fromkeys(identifiers(text)) if entry.role in (Role.USER, Role.ASSISTANT) else {}
    for call in entry.item.calls:
        for value in _argument_strings(call.arguments):
            named.update(dict.fromkeys(identifiers(value, numbers=False)))  # JSON numbers are offsets and limits
    return named, {}


def _argument_strings(arguments: Any) -> Iterator[str]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        yield arguments
        return
    stack = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def carried_facts(
    window: Sequence[Entry],
    previous: Iterable[KeyFact],
    previous_text: str,
    previous_last_seq: int,
) -> list[KeyFact]:
    """The candidates of a new summary, most salient first: the window's identifiers, the previous
    summary's key facts (their counts added up), and what its text named."""
    merged = {f.value: KeyFact(f.value, f.named, f.seen, f.last_seq) for f in previous}
    for value in identifiers(previous_text):
        merged.setdefault(value, KeyFact(value, 1, 0, previous_last_seq))
    for value, fact in window_facts(window).items():
        old = merged.get(value)
        if old is None:
            merged[value] = fact
        else:
            old.named, old.seen = old.named + fact.named, old.seen + fact.seen
            old.last_seq = max(old.last_seq, fact.last_seq)
    return sorted(merged.values(), key=salience, reverse=True)


def salience(fact: KeyFact) -> tuple[int, int, int]:
    """Named before seen only in tool output, then repeated before once-seen, then recent first."""
    return (1 if fact.named else 0, fact.named + fact.seen, fact.last_seq)


def key_facts(candidates: Sequence[KeyFact], summary_text: str, max_facts: int, max_chars: int) -> list[KeyFact]:
    """The candidates the summary's text lacks, most salient first, within `max_facts` and
    `max_chars` (as rendered, one line each): the least salient are the ones left out."""
    kept: list[KeyFact] = []
    used = 0
    for fact in candidates:
        if len(kept) >= max_facts:
            break
        if fact.value in summary_text:
            continue
        size = fact_line_chars(fact)
        if used + size > max_chars:
            continue  # a shorter, less salient one may still fit
        kept.append(fact)
        used += size
    return kept


def fact_line_chars(fact: KeyFact) -> int:
    return len(fact.value) + 3  # "- " and the newline


__all__ = ["carried_facts", "fact_line_chars", "identifiers", "key_facts", "salience", "window_facts"]
