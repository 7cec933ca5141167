"""Key facts: the identifiers a summary must not lose.

Summaries are lossy, and the losses that hurt an agent most are exact names: a file path, a URL,
an id, a number. After each summary we look for the window's identifiers in it and append the
missing ones as a "Key facts" list (none of the seed systems checks its summaries; we do).
"""

from __future__ import annotations

import re

_PATTERNS = [
    re.compile(r"https?://[^\s<>\"'`)\]]+"),  # URLs
    re.compile(r"(?:~|\.{1,2})?(?:/[\w.@+-]+){2,}/?"),  # absolute or relative paths with 2+ parts
    re.compile(r"\b[\w.-]+/[\w./-]*\w"),  # relative paths like src/app.py
    re.compile(r"\b[\w-]+\.(?:py|js|ts|tsx|jsx|md|json|ya?ml|toml|txt|go|rs|java|kt|c|h|cc|cpp|hpp|rb|php|sh|sql|html|css|cfg|ini|lock|log|csv)\b"),
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE),  # UUIDs
    re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),  # hashes, commit shas
    re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b"),  # ticket ids like PROJ-123
    re.compile(r"(?<![\w.])\d+(?:\.\d+)+\b|(?<![\w.])\d{2,}\b"),  # versions, numbers of 2+ digits
]
# Our own bookkeeping and the API's call ids are not the agent's facts.
_NOISE = re.compile(r"^(?:call_|out_\d+_|chatcmpl-)")


def identifiers(text: str) -> list[str]:
    """Identifiers in `text`, in order of first appearance, without duplicates or ones inside longer ones."""
    found: dict[str, None] = {}
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(0).rstrip(".,;:")
            if len(value) >= 2 and not _NOISE.match(value):
                found.setdefault(value, None)
    values = list(found)
    # "src/app.py" already carries "app.py": keep the longer form only (numbers always stand alone).
    return [v for v in values if v.isdigit() or not any(v != other and v in other for other in values)]


def missing_facts(window_text: str, summary: str, limit: int) -> list[str]:
    """The window's identifiers the summary does not contain: names first (paths, URLs, ids,
    versions), then plain numbers while room is left; the most recent of each kind."""
    if not limit:
        return []
    missing = [fact for fact in identifiers(window_text) if fact not in summary]
    # A counter like "00042" in a log is noise, not a fact; a bare number is the weakest kind.
    names = [f for f in missing if not f.isdigit()]
    numbers = [f for f in missing if f.isdigit() and not (len(f) > 1 and f.startswith("0"))]
    kept = names[-limit:]
    room = limit - len(kept)
    return kept + (numbers[-room:] if room > 0 else [])


def with_key_facts(summary: str, missing: list[str]) -> str:
    if not missing:
        return summary
    return summary.rstrip() + "\n\nKey facts (kept verbatim from the summarized messages):\n" + "\n".join(
        f"- {fact}" for fact in missing
    )
