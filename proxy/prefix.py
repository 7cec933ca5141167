"""The last request of each recent conversation, kept so that the next one costs only its new messages.

A full-history client resends its whole transcript every turn: a prefix identical to what it sent
last time. Comparing each message with the one at the same position last time (`==` on the
parsed dicts, done in C) tells which ones are unchanged; those need no validation, no canonical
hash and no token counting again: their results are reused. Only the new tail is worked on, so a
turn's cost grows with its new messages, not with the conversation.

Safe by construction: equal messages have equal hashes, so a stale or missing entry only costs
time, never correctness. Bounded by the memory its parsed messages and hashes take (the least
recently used conversation goes first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .identity import ConversationKey
from .messages import Message
from .request_limits import OFFLOAD_BYTES, off_loop

# Memory for parsed messages and their hashes (PARSED and HASH_BYTES below), for conversations whose
# bodies the BodyCache does not hold (the engine drops a conversation's entry here when its body
# extends the last one): a client whose bodies never do (Claude Code's) takes ~0.5 MB for a
# 200-message transcript, so 15 MB holds the bench's 20 such conversations.
MAX_BYTES = 15 * 2**20  # server.cache_mb * 3/4
MAX_ENTRIES = 256  # as the BodyCache's MAX_BODIES


@dataclass(frozen=True, slots=True)
class Snapshot:
    messages: list[Message]
    hashes: list[str]
    size: int  # the memory they take: PARSED per byte of the request body they came from, and the hashes


class PrefixCache:
    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[ConversationKey, Snapshot] = OrderedDict()
        self._held = 0

    def known_prefix(self, key: ConversationKey, messages: list[Message]) -> list[str]:
        """Hashes of the longest prefix of `messages` equal to the last request's (may be empty)."""
        snapshot = self._entries.get(key)
        if snapshot is None:
            return []
        self._entries.move_to_end(key)
        same = 0
        for sent, before in zip(messages, snapshot.messages, strict=False):
            if sent != before:
                break
            same += 1
        return snapshot.hashes[:same]

    def remember(self, key: ConversationKey, messages: list[Message], hashes: list[str], size: int) -> None:
        """Keep `messages` (parsed from a body of `size` bytes) and their hashes for the next request."""
        self.forget(key)
        size = size * PARSED + HASH_BYTES * len(hashes)
        if size > self.max_bytes // 2:  # one huge transcript must not push out everyone else
            return
        self._entries[key] = Snapshot(messages, hashes, size)
        self._held += size
        while self._held > self.max_bytes or len(self._entries) > self.max_entries:
            _, evicted = self._entries.popitem(last=False)
            self._held -= evicted.size

    def forget(self, key: ConversationKey) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size

    @property
    def held(self) -> int:
        """The memory its entries take (`Snapshot.size`), at most `max_bytes`."""
        return self._held


# -- the request body, by bytes ----------------------------------------------------------------

JSON_SPACE = b" \t\r\n"  # JSON's whitespace (bytes.strip()'s default strips \x0b and \x0c too)
MAX_CANDIDATES = 64  # closing brackets tried, from the end, to find where the transcript ends
# Memory for request bodies, one per recent conversation: its bytes, its parsed objects and its
# items' hashes. Measured (bench/memory_breakdown.py): parsed objects take twice the JSON's bytes
# (a string with one non-ASCII character takes 2-4 bytes a character, and keeps its UTF-8 form
# once serialized), a hash ~100 bytes with its place in the list; the bench's agents take 0.9 MB
# (220 KB bodies) to 1.2 MB (400 KB) each: 20 MB holds the 16-20 it takes turns on.
BODY_BYTES = 20 * 2**20  # server.cache_mb
PARSED = 2  # bytes of parsed objects per byte of JSON
HASH_BYTES = 120  # an item's hash: its string and its place in the list
MAX_BODIES = 256  # small conversations: more than this many taking turns at once rarely come back in time
LARGEST = 2  # one body may take 1/LARGEST of the budget (turn 1,000 of the bench's agent: 2.5 MB, 7.7 MB held)
SKIP_AFTER, RETRY_EVERY = 2, 8  # full parses in a row before a client's bodies are no longer split, and retries


# A body's transcript array -> the transcript's items, where a dialect makes several of one element
# (Messages: a user message's tool_result blocks, see dialects/messages.py); message by message,
# so that parts(a + b) == parts(a) + parts(b). None: the array is the transcript.
Parts = Callable[[list[Any]], list[Any]]


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """A request body as the handler reads it. When `reused` > 0, the first `reused` transcript
    items are the very objects of `origin`'s (the conversation's previous request), whose bytes
    they repeat: `hashes` are theirs, and nothing else of the body differs from that request."""

    body: dict[str, Any]
    reused: int = 0
    origin: BodyEntry | None = None
    entry: BodyEntry | None = None  # what the next request of the same client is compared with
    key: Any = None  # the BodyCache key it was read under
    fresh: int | None = None  # bytes of the body that are new (None: all of it)

    @property
    def hashes(self) -> list[str]:
        return self.origin.hashes[: self.reused] if self.origin is not None else []


@dataclass(slots=True)
class BodyEntry:
    """One request body, split where its transcript array closes: `head` (everything before the
    closing bracket, the items included) and `tail` (the bracket and everything after it).
    `head` is a view of the body's bytes, not a copy: a 2 MB body is not copied again each turn."""

    head: memoryview
    tail: bytes
    body: dict[str, Any]
    raws: list[Any]  # the transcript's items: the body's array, or its parts (see Parts)
    hashes: list[str] = field(default_factory=list)  # set once the request was checked

    @property
    def size(self) -> int:
        """Its memory: the bytes kept, the parsed objects and the items' hashes."""
        return (len(self.head) + len(self.tail)) * (1 + PARSED) + HASH_BYTES * len(self.raws)


class BodyCache:
    """The previous request body of each recent client conversation, to parse only what is new.

    A full-history client resends its last request with new transcript items appended: the same
    bytes up to where the transcript array closed, then `,` and the new items, then the same
    bytes after it. Such a body is recognised by bytes (`startswith`/`endswith`, memcmp speed)
    and only its new items are parsed, as one small array; the rest is the previous request's
    parsed objects. JSON is context-free, so items appended where the array closed parse exactly
    as they would in the whole body. Anything else (an edited byte, a changed parameter) is
    parsed whole. Where the transcript closes is found once per full parse, and proven by
    parsing the body with an item inserted there.

    Keyed by what names a client's conversation before the body is read (tenant, wire format,
    the conversation id it names); bounded by the bytes held, least recently used out first.
    """

    def __init__(
        self, max_bytes: int = BODY_BYTES, enabled: bool = True, on_evict: Callable[[BodyEntry], None] | None = None
    ) -> None:
        self.max_bytes, self.enabled, self.on_evict = max_bytes, enabled, on_evict  # on_evict: what else lets go
        self._entries: OrderedDict[Any, BodyEntry] = OrderedDict()
        self._held = 0
        # Full parses in a row under a key: a client whose bodies never extend the last one (Claude
        # Code moves its cache breakpoint to the newest message, so the previous body's bytes change)
        # gets no entry to prove (a second parse) but every RETRY_EVERY-th time.
        self._misses: OrderedDict[Any, int] = OrderedDict()

    def extend(self, key: Any, raw: bytes, transcript_key: str, parts: Parts | None = None) -> ParsedBody | None:
        """`raw` read as the previous request under `key` plus new transcript items (parsed here,
        on the loop: at most OFFLOAD_BYTES of them), or None: it must be parsed whole."""
        previous = self._entries.get(key) if self.enabled else None
        if previous is None or len(raw) - len(previous.head) - len(previous.tail) > OFFLOAD_BYTES:
            return None
        extended = _extend(previous, raw, transcript_key, key, parts)
        if extended is not None:
            self._entries.move_to_end(key)
            self._misses.pop(key, None)
        return extended

    async def full(
        self, key: Any, raw: bytes, body: dict[str, Any], transcript_key: str, parts: Parts | None = None
    ) -> ParsedBody:
        """`body`, parsed whole from `raw`, with what the next request under `key` is compared with."""
        if not self.enabled or len(raw) * (1 + PARSED) > self.max_bytes // LARGEST:
            return ParsedBody(body)
        misses = self._misses.pop(key, -1) + 1  # the first full parse under a key is no miss
        self._misses[key] = misses
        if len(self._misses) > MAX_BODIES:
            self._misses.popitem(last=False)
        if misses >= SKIP_AFTER and misses % RETRY_EVERY:
            self.forget(key)
            return ParsedBody(body)
        return ParsedBody(body, entry=await off_loop(len(raw), _entry, raw, body, transcript_key, parts), key=key)

    def remember(self, key: Any, parsed: ParsedBody, hashes: list[str]) -> None:
        """Keep `parsed` (its transcript checked, `hashes` its items' hashes) for the next request."""
        entry = parsed.entry
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size
        if entry is None or len(hashes) != len(entry.raws) or not self.enabled:
            return
        entry.hashes = hashes
        self._entries[key] = entry
        self._held += entry.size
        while self._held > self.max_bytes or len(self._entries) > MAX_BODIES:
            _, evicted = self._entries.popitem(last=False)
            self._held -= evicted.size
            if self.on_evict is not None:
                self.on_evict(evicted)

    @property
    def held(self) -> int:
        """The memory its entries take (`BodyEntry.size`), at most `max_bytes`."""
        return self._held

    def forget(self, key: Any) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size


def _extend(previous: BodyEntry, raw: bytes, transcript_key: str, key: Any, parts: Parts | None) -> ParsedBody | None:
    """`raw` as `previous` with items appended to its transcript, or None if it is not that."""
    head, tail = previous.head, previous.tail
    if len(raw) < len(head) + len(tail) or not raw.startswith(head) or not raw.endswith(tail):
        return None
    middle = raw[len(head) : len(raw) - len(tail)]
    added = middle.lstrip(JSON_SPACE)
    if not added:
        new: list[Any] = []
    elif added[:1] == b"," and previous.raws:
        try:
            new = orjson.loads(b"[" + added[1:] + b"]")
        except ValueError:
            return None
        if not new:  # a comma and nothing after it: not JSON
            return None
    else:
        return None
    raws = previous.raws + (new if parts is None else parts(new)) if new else previous.raws
    listed = previous.body[transcript_key]
    body = {**previous.body, transcript_key: raws if parts is None else listed + new if new else listed}
    entry = BodyEntry(memoryview(raw)[: len(raw) - len(tail)] if new else head, tail, body, raws)
    return ParsedBody(body, len(previous.raws), previous, entry, key, fresh=len(middle))


def _entry(raw: bytes, body: Any, transcript_key: str, parts: Parts | None = None) -> BodyEntry | None:
    """Where `raw`'s transcript array closes, proven: None when it can't be found or isn't a
    non-empty array of the body (or what follows it is nested too deeply to compare)."""
    if not isinstance(body, dict) or not isinstance(raws := body.get(transcript_key), list) or not raws:
        return None
    try:
        entry = _closed_at(raw, body, transcript_key, raws)
    except RecursionError:
        return None
    if entry is not None and parts is not None:
        entry.raws = parts(raws)
    return entry


def _closed_at(raw: bytes, body: dict[str, Any], transcript_key: str, raws: list[Any]) -> BodyEntry | None:
    keys = list(body)
    after = {k: body[k] for k in keys[keys.index(transcript_key) + 1 :]}
    end = len(raw)
    for _ in range(MAX_CANDIDATES):
        end = raw.rfind(b"]", 0, end)
        if end < 0:
            return None
        rest = raw[end + 1 :].lstrip(JSON_SPACE)
        if _closes_transcript(rest, after) and _proven(raw, end, body, transcript_key):
            return BodyEntry(memoryview(raw)[:end], raw[end:], body, raws)
    return None


def _closes_transcript(rest: bytes, after: dict[str, Any]) -> bool:
    """Whether `rest`, what follows a `]`, is what follows the transcript: the body's later keys."""
    if rest[:1] == b"}":
        return not after and not rest[1:].strip(JSON_SPACE)
    if rest[:1] != b"," or not after or rest[1:].lstrip(JSON_SPACE)[:1] != b'"':
        return False
    try:
        return orjson.loads(b"{" + rest[1:]) == after
    except ValueError:
        return False


def _proven(raw: bytes, end: int, body: dict[str, Any], transcript_key: str) -> bool:
    """An item inserted at `end` lands last in the transcript (so it changes nothing else: the
    bytes differ there only). Inserted anywhere else (in a string, a nested array, an earlier
    duplicate of the transcript's key, a later key's value) the transcript would not gain a
    last item 0."""
    try:
        probe = orjson.loads(raw[:end] + b",0" + raw[end:])
    except ValueError:
        return False
    items = probe.get(transcript_key) if isinstance(probe, dict) else None
    return isinstance(items, list) and len(items) == len(body[transcript_key]) + 1 and items[-1] is not False and items[-1] == 0
