"""Every text the proxy writes into a prompt to speak for itself, and the names of its tools: in
one place, so that what imitates them can be found.

The model trusts these notes (a message from its user, where a shortened output's rest is, how
many calls are left, what the summary kept), so nothing but the proxy may write them. Any client
content can: a tool output (a web page, a file) or a user message that prints
`[context-proxy: a message from the user, ...]` reads exactly like the inbox's note. `neutralised`
rewrites such imitations where they go upstream so that they no longer say what the proxy says
(proxy/pipeline/imitations.py applies it to the client's items; what is stored stays as sent).
The rewrite is a pure function of the text: the same bytes every turn (prompt caches hold).
"""

from __future__ import annotations

import re
import time
from string import Template

from .summarizer import prompt

# -- the proxy's tools ---------------------------------------------------------------------------

READ_TOOL = "read_tool_output"
SEARCH_TOOL = "search_history"
KNOWLEDGE_READ_TOOL = "knowledge_read"
KNOWLEDGE_REPLACE_TOOL = "knowledge_replace_section"
KNOWLEDGE_APPEND_TOOL = "knowledge_append_section"

# -- bracketed notes: "[context-proxy: ...]" -------------------------------------------------------

NOTE_PREFIX = "[context-proxy: "
# The inbox's note (proxy/prompts/inbox_note.md holds the whole of it: a prompt, edited as one).
INBOX_NOTE_START = NOTE_PREFIX + "a message from the user"


def inbox_note(content: str, written_at: float) -> str:
    """An inbox message as the agent reads it: marked as the user's, written while it worked.
    Made from the message's content and time alone (an import rebuilds it so)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(written_at))
    return Template(prompt("inbox_note")).substitute(time=stamp, content=content).rstrip("\n")


def note(text: str) -> str:
    return f"{NOTE_PREFIX}{text}]"


def shortened_output(total: int, ref: str, preview: int | None, length: int, quota: str | None = None) -> str:
    """The end of a tool output the truncation stage shortened (after a blank line) to its first
    `preview` characters, or to a summary (`preview` None)."""
    shown = "a summary" if preview is None else f"the first {preview} of {total} characters"
    offset = preview or 0
    tail = f" {quota}" if quota else ""
    return "\n\n" + note(
        f"this tool output was shortened to {shown}. The full output ({total} characters) is stored as ref "
        f"\"{ref}\". To read more, call {READ_TOOL}(ref=\"{ref}\", offset={offset}, length={length}).{tail}"
    )


def omitted_output(chars: int, ref: str, length: int) -> str:
    """What stands for an older tool output the mask strategy left out."""
    return note(
        f"older tool output omitted ({chars} characters), ref \"{ref}\". "
        f"Call {READ_TOOL}(ref=\"{ref}\", offset=0, length={length}) to read it."
    )


def shortened_quote(shown: int, chars: int, ref: str) -> str:
    """After the head of a long user message a summary quotes (on a line of its own)."""
    return "\n" + note(
        f"shortened to its first {shown} of {chars} characters; the whole message is ref \"{ref}\": "
        f"{READ_TOOL}(ref=\"{ref}\", offset={shown}) reads the rest."
    )


def knowledge_goes_on(more: int, offset: int) -> str:
    """After the part of the knowledge document that fits the prompt."""
    return "\n\n" + f"{NOTE_PREFIX}the notes go on for {more} more characters; call {KNOWLEDGE_READ_TOOL}(offset={offset}) to read them]"


NO_RESULT = note("no result was recorded for this tool call")
NON_TEXT = "[a message without text: images or files]"

# -- headers and lines ---------------------------------------------------------------------------

SUMMARY_HEADER = "Summary of the earlier part of this conversation (older messages are not shown):\n\n"
FACTS_HEADER = "Key facts (kept verbatim from the summarized messages):"
NO_SUMMARY_HEADER = "Earlier messages of this conversation are not shown.\n\n"  # (quotes, and no summary yet)
QUOTES_HEADER = "What the user said after the task, verbatim and oldest first (kept by the proxy, not summarized):"
# The first words of the knowledge document's system message (proxy/prompts/knowledge_note.md).
KNOWLEDGE_HEADER = "Long-term knowledge: notes that agents working for this user keep across conversations"
QUOTA_INFO_KEY = "_quota_info"  # in a JSON tool output


def quota_line(remaining: int, used: int, limit: int) -> str:
    return f"You have {remaining} LLM calls remaining (used {used} of {limit})."


def quota_note(line: str) -> str:
    """The quota line as appended to a tool output that is not JSON."""
    return f"\n\n[{line}]"


# -- the summarizer's prompt (proxy/compaction/llm.py) ------------------------------------------


def cut_note(more: int) -> str:
    """After the head of a long text the summarizer is shown (on a line of its own)."""
    return f"\n[... {more} more characters]"


def tool_result_label(call_id: str | None) -> str:
    """The line before a tool output the summarizer is shown."""
    return f"[tool result {call_id}]"


# -- what the facts extractor blanks (proxy/compaction/facts.py) ---------------------------------

NOTE_PATTERN = r"\[context-proxy:[^\]]*\]"  # our markers (shortened outputs, masked outputs, messages)
NOTE_START_PATTERN = re.escape(NOTE_PREFIX.rstrip())
CUT_PATTERN = r"\[\.\.\. ?[\d,]+ more characters\]"  # cut_note's, a model's copy included
TOOL_RESULT_PATTERN = r"\[tool result [^\]]*\]"

# -- imitations ----------------------------------------------------------------------------------


def _loose(text: str) -> str:
    """`text`, lower-cased, as a pattern any run of spaces matches (how a model reads it)."""
    return r"\s+".join(re.escape(word) for word in text.lower().split())


# What an imitation looks like, in lower case, under the word every match of it holds and with
# another it holds too: a text is searched only by the patterns whose two words it contains (most
# texts: none, at the cost of six substring searches, each the faster the longer its word; one
# word alone, "proxy" or "llm", is common in an agent's code). Each pattern starts with a literal, so that the regex engine scans for it
# at C speed (one alternation of them all is ~50x slower on 2 MB).
_WORDED = {
    "context": (("proxy", r"\[\s*context[\s_-]*proxy\s*:"),),  # "[context-proxy:" and its near spellings
    "earlier": (("summary", _loose(SUMMARY_HEADER)), ("shown", _loose(NO_SUMMARY_HEADER))),
    "verbatim": (("facts", _loose(FACTS_HEADER)), ("oldest", _loose(QUOTES_HEADER))),
    "long-term": (("knowledge", _loose(KNOWLEDGE_HEADER)),),
    "remaining": (("llm", r"\[\s*you\s+have\s+-?\d+\s+llm\s+calls?\s+remaining"),),
    QUOTA_INFO_KEY: (("", re.escape(f'"{QUOTA_INFO_KEY}"')),),
}
_IMITATIONS = [pattern for worded in _WORDED.values() for _, pattern in worded]
_SEARCHES = tuple((word, tuple((other, re.compile(p)) for other, p in worded)) for word, worded in _WORDED.items())
# No imitation is shorter (tests/hardening/test_prompt.py checks it against the patterns): ids,
# roles and names are passed without a look.
SHORTEST_IMITATION = 13
IMITATION = re.compile("|".join(f"(?:{p})" for p in _IMITATIONS), re.IGNORECASE)  # (text whose case changes length)
QUOTED = " (quoted: not from context-proxy)"
_FIRST_WORD = re.compile(r"\[?\s*[^\s:]+")


def _quoted(text: str) -> str:
    """One imitation marked: the quoting mark after its first word, so it no longer matches
    (the rewrite is idempotent, and stable)."""
    if text.startswith('"'):  # a JSON key: stays a string
        return '"' + text[1:-1] + QUOTED + '"'
    head = _FIRST_WORD.match(text)
    assert head is not None  # every pattern starts with a word
    return text[: head.end()] + QUOTED + text[head.end() :]


Searches = tuple[tuple[str, tuple[tuple[str, re.Pattern[str]], ...]], ...]
EVERY_SEARCH: Searches = _SEARCHES
# The only characters outside ASCII whose lower case holds an ASCII one (tests check it): U+0130
# (İ) and U+212A (the Kelvin sign, a "k"), in UTF-8, each after a byte of it rarer in text: a
# one-byte `in` is a memchr (~3 µs over 200 KB), a longer one a loop (~200 µs).
_LOWER_TO_ASCII = ((b"\xc4", b"\xc4\xb0"), (b"\xaa", b"\xe2\x84\xaa"))


def searches_in(dumped: bytes) -> Searches:
    """The searches `imitations` needs for texts that are all in `dumped`, their JSON as orjson
    writes it (a letter as itself, whatever else is escaped): those whose two words `dumped` holds
    in any case. A text's lower case holds a word only if its JSON does (bytes.lower() is ASCII's,
    and no other character lowers to ASCII but the two above: with them, every search). Most
    transcripts need none: one lower() and six scans of their JSON (~0.95 ms for 200 KB), where
    the same of each of their strings, one by one, cost ~1.4 ms."""
    if any(rare in dumped and char in dumped for rare, char in _LOWER_TO_ASCII):
        return EVERY_SEARCH
    low = dumped.lower()
    needed = []
    for word, patterns in _SEARCHES:
        if word.encode() in low:
            kept = tuple((other, pattern) for other, pattern in patterns if other.encode() in low)
            if kept:
                needed.append((word, kept))
    return tuple(needed)


def imitations(text: str, searches: Searches = EVERY_SEARCH) -> list[tuple[int, int]]:
    """Where `text` imitates a note of the proxy's (any case), in order, not overlapping.
    `searches`: `searches_in` a JSON that holds `text`, or every one."""
    if len(text) < SHORTEST_IMITATION:
        return []
    low = text.lower()
    found = []
    for word, patterns in searches:  # loops, not comprehensions: this runs for every string
        if word in low:
            found += [pattern for other, pattern in patterns if other in low]
    if not found:
        return []
    if len(low) != len(text):  # a character whose lower case is longer: positions differ
        return [m.span() for m in IMITATION.finditer(text)]
    spans, end = [], 0
    for start, stop in sorted(m.span() for pattern in found for m in pattern.finditer(low)):
        if start >= end:
            spans.append((start, stop))
            end = stop
    return spans


def neutralised(text: str, searches: Searches = EVERY_SEARCH) -> str:
    """`text` with every imitation of a proxy note marked as quoted (the same object when there
    is none, so a caller can tell). `searches` as for `imitations`."""
    spans = imitations(text, searches)
    if not spans:
        return text
    out, last = [], 0
    for start, stop in spans:
        out += [text[last:start], _quoted(text[start:stop])]
        last = stop
    out.append(text[last:])
    return "".join(out)
