"""What a request sends besides its transcript: its system prompt and its tools, kept in the record.

Chat's system prompt is a message of its transcript (stored as such); Messages' top-level `system`
and Responses' `instructions` are not, nor is any format's `tools`. Each distinct one is kept once
per conversation, by hash (Store.add_request_parts), and each turn's record names the hashes of
what it sent (`system_hash`, `tools_hash`: None when it sent none), so the trajectory lists every
version with the turns that used it.

Cheap on the hot path. A body that extends the conversation's previous one holds that body's very
objects outside its transcript (prefix.py): their hashes are taken from it, not computed again;
any other body's are compared (`==`, in C) with the previous turn's before anything is encoded
and hashed. (`==` takes 1, 1.0 and true for one another: a tools list changed only so is kept
as the earlier one.) A turn that sends what the conversation's previous turn (in this process)
sent asks nothing of the store; otherwise it hands the store its parts, which keeps the ones it
has not (a replica that never saw the conversation asks once, and the store writes nothing it
holds).

Proxy-history mode (`X-History: proxy`): a Messages or Responses request that carries no system
prompt is sent the conversation's current one (the newest turn's), as DESIGN.md says.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .identity import ConversationKey
from .prefix import PARSED, ParsedBody
from .store import SYSTEM_PART, TOOLS_PART, Conversation, RequestPart, Store, part_hash, part_json

if TYPE_CHECKING:
    from .engine.report import TurnReport
    from .engine.request import ParsedRequest

# Where a format's request carries its system prompt apart from the transcript (chat: in it; a
# format whose system prompt is an object, Gemini's `systemInstruction`, is kept as one).
SYSTEM_KEYS = {"messages": "system", "responses": "instructions", "gemini": "systemInstruction"}
TOOLS_KEY = "tools"
KINDS_OF = {SYSTEM_PART: (str, list, dict), TOOLS_PART: list}  # what is kept (anything else: the upstream's to refuse)
MAX_REMEMBERED = 4096  # conversations whose last parts' hashes are held (~200 bytes each)
# Memory for the values of those parts, to compare the next turn's with instead of hashing them
# (a Claude Code tools list is ~60 KB of JSON): each value held once however many conversations
# sent it (an agent's sessions share their system prompt and tools), the least recently used
# conversation's let go first.
MAX_VALUE_BYTES = 8 * 2**20
NEW = (-1.0, 1)  # the mark of a new conversation's first turn until its end says when it was made (PartsToKeep.ended)


def _body_key(kind: str, dialect: str) -> str | None:
    return SYSTEM_KEYS.get(dialect) if kind == SYSTEM_PART else TOOLS_KEY


def sent_parts(
    dialect: str, body: Mapping[str, Any], parsed: ParsedBody | None = None, previous: Sequence[RequestPart] = ()
) -> list[RequestPart]:
    """The system prompt and tools `body` sends, as parts with their hashes (none for what it does
    not send: absent, null or empty). Hashed only when new: a value that is the very object of
    the previous body `parsed` extends keeps that body's part, one equal to a part of `previous`
    (the conversation's last turn's) that one's hash."""
    origin = parsed.origin if parsed is not None and parsed.reused > 0 else None
    known = origin.request_parts if origin is not None else None
    out: list[RequestPart] = []
    for kind in (SYSTEM_PART, TOOLS_PART):
        name = _body_key(kind, dialect)
        value = body.get(name) if name is not None else None
        if not value or not isinstance(value, KINDS_OF[kind]):
            continue
        before = known.get(kind) if known is not None else None
        if before is not None and origin is not None and origin.body.get(name) is value:
            out.append(before)
            continue
        equal = next((p for p in previous if p.kind == kind and p.value == value), None)  # C-speed ==, no encoding
        # Its hash, with this body's value: the earlier body's objects are not kept alive by it.
        out.append(RequestPart(kind, equal.hash if equal is not None else part_hash(value), value))
    if parsed is not None and parsed.entry is not None:
        parsed.entry.request_parts = {p.kind: p for p in out}  # for the next body that extends this one
    return out


@dataclass(slots=True)
class PartsToKeep:
    """A turn's parts the store may not hold yet: written with the turn's first write (TurnWriter)."""

    parts: list[RequestPart]
    remembered: RequestParts
    mark: tuple[float, int]  # the conversation as it will be once the turn has ended (see RequestParts)

    async def keep(self, store: Store, key: ConversationKey) -> None:
        await store.add_request_parts(key, self.parts)
        self.remembered.remember(key, self.mark, self.parts)

    def ended(self, conversation: Conversation) -> None:
        """The turn kept its record in `conversation` (as it stood before the turn's end). A new
        conversation's mark was not known when its parts were kept (`NEW`): it is now, so that
        its second turn, sending the same, asks the store nothing either."""
        if self.mark == NEW:
            self.remembered.remember(conversation.key, (conversation.created_at, conversation.turns + 1), self.parts)


@dataclass(slots=True)
class _Last:
    """What a conversation's last turn sent: the hashes, held with the conversation's creation time
    and the turn count it will have after that turn; and the parts with their values, to compare
    the next turn's with (those within the memory budget; shared with every conversation that
    sent the same)."""

    mark: tuple[float, int]
    hashes: tuple[str, ...]
    values: tuple[RequestPart, ...] = ()


@dataclass(slots=True)
class _Held:
    """A part's value held to compare with, for `users` conversations."""

    part: RequestPart
    size: int  # the memory its value takes (an estimate: PARSED bytes per byte of its JSON)
    users: int = 0


class RequestParts:
    """The parts each recent conversation's last turn sent, to hash and write only what changed.

    A conversation made again (deleted, imported), or one another replica ran a turn of
    meanwhile, is asked of the store again rather than trusted. Bounded: MAX_REMEMBERED
    conversations, and `max_bytes` of the values kept to compare with, each value once by its
    hash (10,000 conversations of one agent hold one copy of its tools, not 10,000: the memory
    would grow with the conversations up to the budget, ~20 MB resident for 8 MB believed)."""

    def __init__(self, max_entries: int = MAX_REMEMBERED, max_bytes: int = MAX_VALUE_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._last: OrderedDict[ConversationKey, _Last] = OrderedDict()
        self._values: dict[str, _Held] = {}  # hash -> the value held for the conversations that sent it
        self._held = 0

    def sent(self, key: ConversationKey, dialect: str, body: Mapping[str, Any], parsed: ParsedBody | None) -> list[RequestPart]:
        """sent_parts of a request of the conversation `key`, compared with its last turn's."""
        last = self._last.get(key)
        return sent_parts(dialect, body, parsed, last.values if last is not None else ())

    def to_keep(
        self, key: ConversationKey, parts: Sequence[RequestPart], conversation: Conversation | None
    ) -> PartsToKeep | None:
        """What this turn (of `conversation` as it stands before it) must hand the store: None when
        its parts are the previous turn's, or it sends none."""
        if conversation is None:
            return PartsToKeep(list(parts), self, NEW) if parts else None
        mark = (conversation.created_at, conversation.turns + 1)
        hashes = tuple(p.hash for p in parts)
        last = self._last.get(key)
        if not parts or (last is not None and (last.mark, last.hashes) == ((conversation.created_at, conversation.turns), hashes)):
            self.remember(key, mark, parts)
            return None
        return PartsToKeep(list(parts), self, mark)

    def remember(self, key: ConversationKey, mark: tuple[float, int], parts: Sequence[RequestPart]) -> None:
        """`parts` are what the conversation's turn that will leave it at `mark` sent, kept."""
        old = self._last.pop(key, None)
        values = tuple(held for held in map(self._hold, parts) if held is not None)
        if old is not None:
            self._release(old)  # after holding the new ones: the same parts are not sized again
        self._last[key] = _Last(mark, tuple(p.hash for p in parts), values)
        while self._held > self.max_bytes or len(self._last) > self.max_entries:
            _, evicted = self._last.popitem(last=False)
            self._release(evicted)

    def _hold(self, part: RequestPart) -> RequestPart | None:
        """The value held for `part`'s hash (this one when it is new), one more conversation using
        it; None when it is too big to hold (one huge tools list must not push out everyone else's)."""
        held = self._values.get(part.hash)
        if held is None:
            size = len(part_json(part.value)) * PARSED  # measured once per value, not per turn
            if size > self.max_bytes // 8:
                return None
            held = self._values[part.hash] = _Held(part, size)
            self._held += size
        held.users += 1
        return held.part

    def _release(self, last: _Last) -> None:
        for part in last.values:
            held = self._values[part.hash]
            held.users -= 1
            if not held.users:
                del self._values[part.hash]
                self._held -= held.size

    @property
    def held(self) -> int:
        """The memory the values kept take (an estimate), at most `max_bytes`."""
        return self._held


async def current_parts(store: Store, conversation: Conversation) -> dict[str, RequestPart]:
    """The system prompt and tools the conversation's newest turn sent (by kind; absent: none)."""
    if not conversation.turns:
        return {}
    newest = await store.turn_records(conversation.key, after=conversation.turns - 1)
    named = {kind: newest[-1].get(f"{kind}_hash") for kind in (SYSTEM_PART, TOOLS_PART)} if newest else {}
    if not any(named.values()):
        return {}
    kept = {p.hash: p for p in await store.request_parts(conversation.key)}
    return {kind: kept[h] for kind, h in named.items() if h in kept}


def with_turns(parts: Sequence[RequestPart], turns: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every part, as the trajectory shows it: with the numbers of the turns that sent it."""
    used: dict[str, list[int]] = {p.hash: [] for p in parts}
    for record in turns:
        for kind in (SYSTEM_PART, TOOLS_PART):
            named = record.get(f"{kind}_hash")
            if named in used:
                used[named].append(record["turn"])
    return [{**p.to_api(), "turns": used[p.hash]} for p in parts]


def restore_system(dialect: str, body: dict[str, Any], stored: Mapping[str, RequestPart]) -> dict[str, Any]:
    """`body` with the stored system prompt when it sends none (proxy-history mode); else itself."""
    name = SYSTEM_KEYS.get(dialect)
    part = stored.get(SYSTEM_PART)
    if name is None or part is None or body.get(name):
        return body
    return {**body, name: part.value}


async def with_request_parts(
    store: Store, remembered: RequestParts, request: ParsedRequest, key: ConversationKey, report: TurnReport
) -> None:
    """Before a turn runs: in proxy-history mode a request without a system prompt gets the
    stored one; then what it sends besides its transcript goes in its report (and record)."""
    name = SYSTEM_KEYS.get(request.dialect.name)
    if request.history == "proxy" and name is not None and not request.body.get(name):
        conversation = await store.get(key)
        if conversation is not None:
            request.body = restore_system(request.dialect.name, request.body, await current_parts(store, conversation))
    report.request_parts = remembered.sent(key, request.dialect.name, request.body, request.parsed)
