"""A conversation's words for people: its task (what the agent was asked) and its title.

The task is the first user text of the conversation, without the blocks agents put before the
real request (Claude Code's `<system-reminder>`, Codex's `<environment_context>`, ...): what a
person typed. The title is one a client or a person set (the `X-Conversation-Title` header,
`PATCH /v1/conversations/{id}`), else the task's first words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .errors import InvalidRequest
from .transcript import Codec, Raw, Role

TITLE_HEADER = "X-Conversation-Title"
MAX_TITLE_CHARS = 200
MAX_TASK_CHARS = 300  # what is kept of the task: enough to recognise and search it
TITLE_WORDS_CHARS = 80  # a title made from the task: its first words, up to this
TASK_SCAN_ITEMS = 64  # the task is near the start: never read a whole transcript for it
TASK_SCAN_CHARS = 65536  # ... nor a whole huge message: its start holds the wrapped blocks and the task
TASK_SCAN_TOTAL_CHARS = 4 * TASK_SCAN_CHARS  # ... nor more than this of all the items read for it
# A block an agent wraps around what it adds to the user's message: <tag ...> ... </tag>, opened at
# a line's start (so a tag the user wrote inside a sentence stays). Only the opening is a pattern
# (it never looks past its line); the closing is found with str.find, see without_wrapped_blocks.
OPENING_TAG = re.compile(r"^[ \t]*<([A-Za-z][\w-]*)(?:[ \t][^>\n]*)?>", re.MULTILINE)
MAX_OPENINGS = 64  # openings looked at in one message: past these, the rest of it stays as it is
SPACE = re.compile(r"\s+")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def task_of(codec: Codec, raws: Sequence[Raw]) -> str | None:
    """The conversation's task: the first user item's text that is more than wrapped blocks,
    whitespace collapsed, cut to MAX_TASK_CHARS; None if the first items hold none."""
    budget = TASK_SCAN_TOTAL_CHARS
    for raw in raws[:TASK_SCAN_ITEMS]:
        # One item at a time (its role needs no item before it): the task is usually the second,
        # and a first turn of 200 messages made 64 items for it (0.15 ms, a quarter of its item-making).
        (item,) = codec.items([raw], (None,), (None,))
        if item.role is not Role.USER:
            continue
        text = (codec.text(item) or "")[: min(TASK_SCAN_CHARS, budget)]
        words = SPACE.sub(" ", without_wrapped_blocks(text)).strip()
        if words:
            return words[:MAX_TASK_CHARS].rstrip()
        budget -= len(text)
        if budget <= 0:
            break
    return None


def without_wrapped_blocks(text: str) -> str:
    """`text` without the wrapped blocks it holds, in bounded time: a regex that matched whole
    blocks (`<tag>.*?</tag>`) would rescan the rest of the text from every opening never closed,
    seconds of the event loop for 64 KiB of `<a>` lines. Here each opening costs one search from
    where the last block ended and one str.find of its closing, for at most MAX_OPENINGS of them."""
    kept: list[str] = []
    cursor = at = 0
    unclosed: set[str] = set()
    for _ in range(MAX_OPENINGS):
        opening = OPENING_TAG.search(text, at)
        if opening is None:
            break
        tag = opening.group(1)
        end = -1 if tag in unclosed else text.find(f"</{tag}>", opening.end())
        if end == -1:
            unclosed.add(tag)  # no closing after here: not looked for again
            at = opening.end()
            continue
        kept += (text[cursor : opening.start()], " ")
        cursor = at = end + len(tag) + 3
    kept.append(text[cursor:])
    return "".join(kept)


def title_from_task(task: str | None) -> str | None:
    """The task's first words, cut at a word boundary near TITLE_WORDS_CHARS."""
    if not task:
        return None
    if len(task) <= TITLE_WORDS_CHARS:
        return task
    cut = task[:TITLE_WORDS_CHARS]
    space = cut.rfind(" ")
    return (cut[:space] if space > TITLE_WORDS_CHARS // 2 else cut).rstrip(" ,.;:") + "…"


def check_title(value: object, where: str) -> str | None:
    """A title a client or person set, checked: text of at most MAX_TITLE_CHARS, no control
    characters; an empty one is None (no title of its own). InvalidRequest names `where`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a string or null", param=where)
    title = value.strip()
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidRequest(f"{where} must be at most {MAX_TITLE_CHARS} characters", param=where)
    if CONTROL.search(title):
        raise InvalidRequest(f"{where} must not contain control characters", param=where)
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:  # a header's bytes that were not UTF-8
        raise InvalidRequest(f"{where} must be UTF-8 text", param=where) from None
    return title or None
