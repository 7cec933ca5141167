"""Long-term knowledge: a markdown document per tenant (and namespace) that agents keep across
conversations, as the seed's `index.md`. This module is the document itself: its template, its
sections and how the agent's edits change them, how it goes into a prompt, and diffs between
versions. Where it is kept: the store (every version); where it goes upstream:
proxy/pipeline/knowledge.py; the tools that edit it: proxy/tools/knowledge.py.

A section is a markdown heading line (`#` to `######`) and everything up to the next heading of
the same or a higher level. Headings are matched by their text, case and `#`s aside.
"""

from __future__ import annotations

import difflib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from string import Template

from .markers import KNOWLEDGE_APPEND_TOOL, KNOWLEDGE_REPLACE_TOOL, knowledge_goes_on, neutralised
from .store import KnowledgeStore, KnowledgeVersion
from .summarizer import prompt

MAX_DOCUMENT_CHARS = 200_000  # a stored version, however written (the prompt holds max_tokens of it)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
CAS_TRIES = 5  # an edit retried on a newer version this many times before it gives up


def template() -> str:
    """The document a tenant's first conversation with knowledge on starts from."""
    return prompt("knowledge")


def heading_key(text: str) -> str:
    """A heading's text as sections are matched: without `#`s, spaces and case."""
    return " ".join(text.strip().lstrip("#").split()).casefold()


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    level: int
    start: int  # line index of its heading
    end: int  # line index after its last line


def sections(text: str) -> list[Section]:
    lines = text.split("\n")
    found: list[tuple[int, int, str]] = []  # (line, level, title)
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced  # a `#` inside a code block is no heading
        elif not fenced and (match := HEADING.match(line)):
            found.append((i, len(match.group(1)), match.group(2)))
    out = []
    for n, (start, level, title) in enumerate(found):
        end = next((s for s, lv, _ in found[n + 1 :] if lv <= level), len(lines))
        out.append(Section(title, level, start, end))
    return out


class EditRefused(ValueError):
    """An edit the document can't take; the message tells the agent what to do instead."""


def replace_section(text: str, heading: str, content: str) -> str:
    """`text` with the body of section `heading` replaced by `content` (empty: the section goes)."""
    lines = text.split("\n")
    key = heading_key(heading)
    match = next((s for s in sections(text) if heading_key(s.title) == key), None)
    if match is None:
        titles = ", ".join(repr(s.title) for s in sections(text)) or "none"
        raise EditRefused(f"No section is headed {heading!r} (the sections are: {titles}); append it as a new section.")
    body = content.strip("\n")
    new = [] if not body else [lines[match.start], "", *body.split("\n"), ""]
    return "\n".join([*lines[: match.start], *new, *lines[match.end :]]).rstrip("\n") + "\n"


def append_section(text: str, heading: str, content: str) -> str:
    """`text` with a new `## heading` section at its end."""
    title = " ".join(heading.strip().lstrip("#").split())
    if not title:
        raise EditRefused("A section needs a heading.")
    if any(heading_key(s.title) == heading_key(title) for s in sections(text)):
        raise EditRefused(f"A section headed {title!r} exists already: replace it instead of adding another.")
    return text.rstrip("\n") + f"\n\n## {title}\n\n{content.strip(chr(10))}\n"


def diff(old: KnowledgeVersion | None, new: KnowledgeVersion) -> str:
    """A unified diff from `old` (None: an empty document) to `new`."""
    before = old.text if old is not None else ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), new.text.splitlines(keepends=True),
        fromfile=f"version {old.version if old else 0}", tofile=f"version {new.version}",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


EDITING = (
    " When you learn something the next agent should know (a fact about the project, a decision and its reason, "
    f"a pitfall, where something is), record it with {KNOWLEDGE_APPEND_TOOL} or {KNOWLEDGE_REPLACE_TOOL};"
)


def header(namespace: str, version: int, editable: bool = True) -> str:
    """The note's first lines; it names the editing tools only when the agent is offered them."""
    where = f'namespace "{namespace}"' if namespace else "the default notes"
    return Template(prompt("knowledge_note")).substitute(where=where, version=version, editing=EDITING if editable else "")


def fits(namespace: str, text: str, max_tokens: int, measure: Callable[[str], int]) -> bool:
    """Whether a document of `text` goes into the prompt whole, whatever its version number."""
    return measure(header(namespace, 10**6) + text) <= max_tokens


def note(version: KnowledgeVersion, max_tokens: int, measure: Callable[[str], int], editable: bool = True) -> str:
    """The system message that carries `version` upstream, within `max_tokens` (`measure`: text ->
    tokens). A document too long for it (one written by the admin API, or under a larger budget)
    is cut, with a marker saying how to read the rest. The document is anyone's writing (an
    agent's, the API's): what imitates the proxy's notes in it is marked quoted."""
    head = header(version.namespace, version.version, editable)
    whole = head + neutralised(version.text)
    if measure(whole) <= max_tokens:
        return whole
    room = max_tokens - measure(head) - MARKER_TOKENS
    end = fit(version.text, room, measure)  # (offsets are the stored text's: knowledge_read's)
    return head + neutralised(version.text[:end]) + knowledge_goes_on(len(version.text) - end, end)


MARKER_TOKENS = 40  # the cut marker above: ~30 tokens


def fit(text: str, room: int, measure: Callable[[str], int], start: int = 0) -> int:
    """The largest end (a few tries, each scaled by the measured overshoot) such that
    text[start:end] takes at most `room` tokens."""
    end = len(text)
    for _ in range(4):
        tokens = measure(text[start:end])
        if tokens <= room:
            return end
        end = start + max(int((end - start) * room / max(tokens, 1) * 0.95), 0)
    return start


async def current(store: KnowledgeStore, tenant: str, namespace: str, *, write: bool = True) -> KnowledgeVersion:
    """The newest version, seeding the document from the template when it has none yet; without
    `write` (a count of a prompt writes nothing) an unseeded document is the seed as it would be."""
    for _ in range(CAS_TRIES):
        found = await store.knowledge(tenant, namespace)
        if found is not None:
            return found
        if not write:
            return KnowledgeVersion(tenant, namespace, 1, template(), time.time(), "seed")
        seeded = await store.put_knowledge(tenant, namespace, template(), "seed", base_version=0)
        if seeded is not None:
            return seeded
    raise RuntimeError("the knowledge document changes faster than it can be read")  # never in practice


async def edit(
    store: KnowledgeStore, tenant: str, namespace: str, change: Callable[[str], str], source: str
) -> tuple[KnowledgeVersion, KnowledgeVersion]:
    """Apply `change` to the newest version and write the result as the next one, retried on a
    version written meanwhile (compare-and-set: two agents' edits never overwrite each other).
    Returns (the version changed, the version written); `change` may raise EditRefused."""
    for _ in range(CAS_TRIES):
        base = await current(store, tenant, namespace)
        text = change(base.text)
        if len(text) > MAX_DOCUMENT_CHARS:
            raise EditRefused(
                f"The notes would hold {len(text)} characters, over the {MAX_DOCUMENT_CHARS} kept at most."
            )
        written = await store.put_knowledge(tenant, namespace, text, source, base_version=base.version)
        if written is not None:
            return base, written
    raise EditRefused("The notes are being edited by another agent right now; try again.")

