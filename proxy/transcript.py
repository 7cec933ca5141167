"""The engine's transcript: wire-format-neutral items, and the helpers every stage shares.

An `Item` is one entry of a conversation as its dialect read it: a chat message, a Responses
input item, an Anthropic message. `raw` is the wire object exactly as it goes upstream (what the
client sent, or a stage's rewrite of it) and exactly what is stored; what a stage needs to know
about it (its role, the calls it makes, the call it answers, whether it belongs with the item
before it) was read off `raw` once, by the dialect's codec. Stages read those fields and never
look inside `raw`; to change an item they ask the codec (`Codec.with_text`), so no stage knows a
wire format.

Units: an item that `joins` goes in or out of a prompt with the item before it (a tool result
with its call, a Responses function_call with the reasoning before it). A unit is a maximal run
of such items; the window and compaction cut only between units, so a call never splits from its
result and a reasoning item never loses the item it belongs to.

The shared facts stages leave on items: `pinned` (the task, always sent), `ref` (a shortened or
masked tool output, readable through read_tool_output), `masked`, `origin` (an item a stage of
the proxy made: the summary, knowledge, an inbox note; so a later stage can find it again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

Raw = dict[str, Any]


# On Python 3.11 an Enum member is found through EnumType.__getattr__'s slot hook: `Role.TOOL`
# costs ~75 ns, fifteen times a local name. A loop over a whole transcript (a first turn's, a cut
# turn's: hundreds of items, in several stages) looks the members it compares with up once.
class Role(str, Enum):
    SYSTEM = "system"  # system / developer instructions
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a tool result
    OTHER = "other"  # reasoning, and item types the proxy does not know: kept and counted, never rewritten


class Origin(str, Enum):
    """Which part of the proxy made an item, so that a later stage can find it again (an item
    the client sent has none)."""

    SUMMARY = "summary"  # the compaction summary's note (the window adds what it leaves out to it)
    KNOWLEDGE = "knowledge"  # the long-term knowledge document's system message
    INBOX = "inbox"  # an inbox message delivered as a note of its own


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call an assistant item makes: `arguments` is the JSON text of its arguments."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Item:
    """Never changed once made, like its `raw`: the fast path hands a turn's items to the next
    one, so a stage makes a changed copy (`but`, the codec's `with_text`). Not a frozen
    dataclass, whose __init__ sets each field through object.__setattr__: six times the cost of
    plain slots, and a first turn makes an item for each of its hundreds of messages."""

    raw: Raw
    role: Role
    seq: int | None = None  # its place in the conversation log; None for what is not stored
    hash: str | None = None  # canonical hash of `raw`, when `raw` is still what the client sent
    calls: tuple[Call, ...] = ()
    answers: str | None = None  # the call id a tool result answers
    joins: bool = False  # goes in or out together with the item before it
    pinned: bool = False
    ref: str | None = None
    masked: bool = False
    origin: Origin | None = None  # which part of the proxy made this item; None: the client

    def but(self, **changes: Any) -> Item:
        return replace(self, **changes)


class Codec(Protocol):
    """A dialect's knowledge of its own items: what stages may ask of, and make, in its format."""

    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        """Read `raws` into items (role, calls, answers, joins); `seqs` and `hashes` go with them."""

    def hash(self, raw: Raw) -> str:
        """The canonical hash: equal for two items that mean the same (dedupe of resent history)."""

    def text(self, item: Item) -> str | None:
        """The item's text: a tool result's output, a message's text; None if it has none."""

    def with_text(self, item: Item, text: str) -> Item:
        """The item with its text replaced (a tool result shortened, masked...): a new raw, no hash."""

    def with_appended_text(self, item: Item, text: str) -> Item:
        """The item with `text` added after its own."""

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        """(every text of `raw` that counts as prompt tokens, the flat tokens it adds besides)."""

    def system_note(self, text: str) -> Item:
        """An instruction of the proxy's own (a summary), in this format."""

    def user_note(self, text: str) -> Item:
        """A user item of the proxy's making (an inbox message delivered as a message of its own),
        in this format: it goes right before a user item of the client's."""

    def tool_result(self, call: Call, text: str) -> Item:
        """A result for `call` (a missing result filled in, a read_tool_output answered)."""


# -- the helpers every stage shares -------------------------------------------------------------


def is_instruction(item: Item) -> bool:
    """A system/developer instruction of the client's, wherever it stands in the transcript
    (Claude Code's environment block after the task, a chat system message mid-conversation):
    instructions are not history, so no stage that leaves history out leaves them out."""
    return item.role is Role.SYSTEM and item.origin is None


def instructions_in(items: Sequence[Item], start: int, end: int) -> list[int]:
    """The indices from `start` to `end` of the items `is_instruction` names, in order: its rule
    inline, without a call per item (the window scans a conversation's whole history with it)."""
    system = Role.SYSTEM  # looked up once (see Role)
    return [i for i, item in enumerate(items[start:end], start) if item.role is system and item.origin is None]


def leading_system_count(items: Sequence[Item]) -> int:
    """How many items at the start are system/developer instructions."""
    system = Role.SYSTEM
    for i, item in enumerate(items):
        if item.role is not system:
            return i
    return len(items)


def units(items: Sequence[Item], start: int = 0) -> list[tuple[int, int]]:
    """[start, end) ranges of items that go in or out together (see the module docstring)."""
    out: list[tuple[int, int]] = []
    i, n = start, len(items)
    while i < n:
        j = i + 1
        while j < n and items[j].joins:
            j += 1
        out.append((i, j))
        i = j
    return out


def unit_start(items: Sequence[Item], index: int, floor: int = 0) -> int:
    """The start of the unit holding `items[index]` (never before `floor`)."""
    while index > floor and items[index].joins:
        index -= 1
    return index


def unit_end(items: Sequence[Item], end: int) -> int:
    """Move `end` forward past items that join the one before: a cut at the result is a cut after it."""
    while end < len(items) and items[end].joins:
        end += 1
    return end


def first_user(items: Sequence[Item]) -> int | None:
    """The index of the first user item (the task), if any."""
    return next((i for i, item in enumerate(items) if item.role is Role.USER), None)


def tool_names(items: Sequence[Item]) -> dict[str, str]:
    """call id -> tool name, over every call the items make."""
    return {call.id: call.name for item in items for call in item.calls}
