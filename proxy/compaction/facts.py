"""Key facts: the statements a summary must not lose.

Summaries are lossy, and the losses that hurt an agent most are exact: the line that said where
the bug is, the warning among a thousand log lines, the note in a code listing, a figure the
assistant found. After each summary the proxy looks for the window's salient statements in it and
keeps the missing ones as a "Key facts" list, carried forward from summary to summary within
`key_facts_chars` (none of the seed systems checks its summaries; we do).

A statement is the line or sentence that carries it (see the section "statements" below for what
makes one salient). Identifiers (`identifiers`) are what a statement carries: paths, URLs, ids,
shas, tickets, versions, numbers a person wrote. What never counts: parts of timestamps, clock
times, dates, durations, sizes, percentages, float measurements, hex dumps, a log's bare numbers,
and the proxy's own markers, refs and call ids (the proxy's "[... 26000 more characters]" once
became a key fact, and the model a made-up ref).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..markers import CUT_PATTERN, NOTE_PATTERN, NOTE_START_PATTERN, TOOL_RESULT_PATTERN
from ..store import KeyFact
from ..transcript import Role
from .windows import Entry

# Spans that are never facts, blanked before identifiers are looked for, so that no part of them
# ("46.403" of "12:04:46.403") survives either.
_NOISE = re.compile(
    "|".join(
        (
            NOTE_PATTERN,  # our markers (shortened outputs, masked outputs, messages)
            CUT_PATTERN,  # our cut marker in the summarizer's prompt
            TOOL_RESULT_PATTERN,  # our render label in the summarizer's prompt
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


# -- statements ----------------------------------------------------------------------------------
# A key fact is a statement: the line or sentence that carries what matters, not its bare token
# ("WARN ledger drift of 4711 cents in services/ledger/drift.py", not "services/ledger/drift.py").
# What makes one salient is read off the transcript's own shape, not off what a given agent
# happens to print: a line unlike its neighbours (a WARN among INFO lines, a comment among code,
# a prose field among a JSON result's short values), an identifier rare in the conversation (one
# that every listing repeats names nothing), the assistant's stated findings and its calls'
# arguments. Filler that repeats, timestamps, counters and the proxy's own markers never count.

MAX_STATEMENT_CHARS = 220  # a statement past this is cut around what it carries
RARE_MESSAGES = 2  # an identifier in at most this many messages of the window is rare
MIN_SCORE = 3  # weaker candidates are not facts

_LEVEL = re.compile(r"\b(WARN(?:ING)?|ERROR|ERR|FATAL|CRITICAL|SEVERE|PANIC|Traceback|Exception)\b")
_COMMENT = re.compile(r"^\s*(?:#(?!!)|//|--(?!-)|/\*|\*(?!\*)|;;|<!--)\s*(.*)$")
_ATTENTION = re.compile(r"\b(?:NOTE|TODO|FIXME|HACK|XXX|IMPORTANT|WARNING|BUG|SECURITY)\b")
_FINDING = re.compile(
    r"\b(?:root cause|found|because|the (?:bug|problem|issue|cause)|is in|fails?|failing|broke|tracked as|turns out|"
    r"means|must|never|always|decided|instead|totals?|drift|leak|regression|caused by)\b",
    re.I,
)
_LEADING_STAMP = re.compile(
    r"^\s*\[?\d{4}-\d{2}-\d{2}[T ]?[\d:.,]*(?:Z|[+-]\d{2}:?\d{2})?\]?\s*|^\s*\[?\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?\]?\s*"
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(`])|\n+")
_MARKER = re.compile(f"{NOTE_START_PATTERN}|{CUT_PATTERN}")
_OUR_SPANS = re.compile(f"{NOTE_PATTERN}|{CUT_PATTERN}")  # a model quoting our markers


def _clean(line: str) -> str:
    """A line as a statement: no leading timestamp, one space between words, bounded."""
    text = " ".join(_LEADING_STAMP.sub("", line).split())
    if len(text) > MAX_STATEMENT_CHARS:
        text = text[: MAX_STATEMENT_CHARS - 1].rstrip() + "…"
    return text


def _normal(text: str) -> str:
    """A statement's form for telling repeats apart: digits and case aside."""
    return re.sub(r"\d+", "0", text.lower())


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def _json_prose(text: str) -> list[str]:
    """The prose fields of a JSON result ("key: a sentence"), among its short values."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return []
    try:
        parsed = json.loads(text[start:])
    except ValueError:
        return []
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", parsed)]
    while stack and len(found) < 20:
        name, node = stack.pop()
        if isinstance(node, dict):
            stack.extend(reversed([(str(k), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(name, v) for v in node]))
        elif isinstance(node, str) and len(node.split()) >= 5:
            found.append(f"{name}: {node}" if name else node)
    return found


def _tool_candidates(text: str) -> Iterator[tuple[str, int]]:
    """(statement, score) of a tool output's lines unlike their neighbours."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return
    leveled = [bool(_LEVEL.search(line)) for line in lines]
    comments = [bool(_COMMENT.match(line)) for line in lines]
    many = len(lines) >= 8
    heads = [_head(line) for line in lines] if many else []
    usual = Counter(heads).most_common(1)[0] if heads else (None, 0)
    uniform = usual[0] is not None and usual[1] >= 0.6 * len(lines)  # a log: most lines open alike (INFO ...)
    for i, line in enumerate(lines):
        if _MARKER.search(line):
            continue
        if leveled[i] and (not many or sum(leveled) <= len(lines) // 5):
            yield _clean(line), 6  # a warning or error among ordinary lines
        elif uniform and heads[i] != usual[0] and heads[i] not in _QUIET:
            yield _clean(line), 6  # a line whose level (its first word) is not its neighbours' own
        elif comments[i] and many and sum(comments) <= len(lines) // 5:
            body = _COMMENT.match(line).group(1)  # type: ignore[union-attr]
            if len(body.split()) >= 4:
                yield _clean(body), 6 if _ATTENTION.search(body) else 4  # a comment among code
        elif _ATTENTION.search(line) and many:
            yield _clean(line), 4
    for prose in _json_prose(text):
        yield _clean(prose), 5  # a sentence among a JSON result's short values


_HEAD = re.compile(r"(?:level=)?\"?([A-Za-z]{1,8})\b")
_QUIET = frozenset({None, "INFO", "I", "DEBUG", "D", "TRACE", "T", "NOTICE"})


def _head(line: str) -> str | None:
    """A log line's level: its first word after the timestamp, upper-cased (None: not a word)."""
    match = _HEAD.match(_LEADING_STAMP.sub("", line, count=1))
    return match.group(1).upper() if match else None


def _call_statement(name: str, arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return _clean(f"called {name}: {arguments}")
    if not isinstance(parsed, dict):
        return _clean(f"called {name}: {arguments}")
    shown = ", ".join(f"{k}={v}" for k, v in parsed.items() if isinstance(v, str | int | float) and not isinstance(v, bool))
    return _clean(f"called {name}({shown})")


def window_facts(window: Sequence[Entry]) -> dict[str, KeyFact]:
    """The window's salient statements (value: the statement; named: its score; seen: the
    messages it came from; last_seq: the newest of them), in order of first appearance. User
    messages are left out: the summary carries them verbatim ("What the user said")."""
    # How many messages name each identifier: one that many messages show names nothing.
    spread: dict[str, int] = {}
    for entry in window:
        for value in set(_entry_identifiers(entry)):
            spread[value] = spread.get(value, 0) + 1
    # How often each statement occurs: one said again and again is filler.
    candidates: list[tuple[str, int, int]] = []  # (statement, score, seq)
    for entry in window:
        for statement, score in _candidates(entry):
            candidates.append((statement, score, entry.seq))
    repeats: dict[str, set[int]] = {}
    for statement, _, seq in candidates:
        repeats.setdefault(_normal(statement), set()).add(seq)
    facts: dict[str, KeyFact] = {}
    for statement, score, seq in candidates:
        named = identifiers(statement)
        rare = [v for v in named if spread.get(v, 0) <= RARE_MESSAGES]
        if named and not rare and score < 6:
            score -= 2  # what it names, every listing names
        elif rare:
            score += 2
        if len(repeats[_normal(statement)]) > RARE_MESSAGES and not rare:
            continue  # filler: said again and again (a counter aside), naming nothing of its own
        if score < MIN_SCORE or len(statement) < 12:
            continue
        fact = facts.get(statement)
        if fact is None:
            facts[statement] = KeyFact(statement, score, 1, seq)
        else:
            fact.named, fact.seen, fact.last_seq = max(fact.named, score), fact.seen + 1, max(fact.last_seq, seq)
    return facts


def _entry_identifiers(entry: Entry) -> list[str]:
    values = identifiers(entry.text or "", numbers=entry.role is not Role.TOOL)
    for call in entry.item.calls:
        for value in _argument_strings(call.arguments):
            values.extend(identifiers(value, numbers=False))
    return values


def _candidates(entry: Entry) -> Iterator[tuple[str, int]]:
    text = entry.text or ""
    if entry.role is Role.TOOL:
        yield from _tool_candidates(text)
    elif entry.role is Role.ASSISTANT:
        for sentence in _sentences(_OUR_SPANS.sub(" ", text)):
            if _MARKER.search(sentence):
                continue
            carries = bool(identifiers(sentence))
            finding = bool(_FINDING.search(sentence))
            if carries or finding:
                yield _clean(sentence), 3 + 2 * carries + finding  # the assistant's stated findings
        for call in entry.item.calls:
            if any(identifiers(v, numbers=False) for v in _argument_strings(call.arguments)):
                yield _call_statement(call.name, call.arguments), 3  # the arguments of its calls


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
    """The candidates of a new summary, most salient first: the window's statements and the
    previous summary's key facts (a statement seen again keeps its best score). What the previous
    summary's text said needs no carrying: a statement it lost is among its key facts already."""
    merged = {f.value: KeyFact(f.value, f.named, f.seen, f.last_seq) for f in previous}
    for value, fact in window_facts(window).items():
        old = merged.get(value)
        if old is None:
            merged[value] = fact
        else:
            old.named, old.seen = max(old.named, fact.named), old.seen + fact.seen
            old.last_seq = max(old.last_seq, fact.last_seq)
    return sorted(merged.values(), key=salience, reverse=True)


def salience(fact: KeyFact) -> tuple[int, int]:
    """The stronger statement first (its score), then the newer."""
    return (fact.named, fact.last_seq)


def shown_in(fact: KeyFact, text: str) -> bool:
    """Whether `text` (the summary) already says the statement: it holds it, or every identifier
    it carries (a statement without one: most of its words)."""
    if fact.value in text:
        return True
    named = identifiers(fact.value)
    if named:
        return all(value in text for value in named)
    words = [w for w in re.findall(r"[a-z]{4,}", fact.value.lower())]
    lower = text.lower()
    return bool(words) and sum(w in lower for w in words) >= 0.8 * len(words)


def key_facts(candidates: Sequence[KeyFact], summary_text: str, max_facts: int, max_chars: int) -> list[KeyFact]:
    """The candidates the summary's text lacks, most salient first, within `max_facts` and
    `max_chars` (as rendered, one line each): the least salient are the ones left out."""
    kept: list[KeyFact] = []
    used = 0
    for fact in candidates:
        if len(kept) >= max_facts:
            break
        if shown_in(fact, summary_text):
            continue
        size = fact_line_chars(fact)
        if used + size > max_chars:
            continue  # a shorter, less salient one may still fit
        kept.append(fact)
        used += size
    return kept


def fact_line_chars(fact: KeyFact) -> int:
    return len(fact.value) + 3  # "- " and the newline


__all__ = ["carried_facts", "fact_line_chars", "identifiers", "key_facts", "salience", "shown_in", "window_facts"]
