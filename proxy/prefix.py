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

import asyncio
import re
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
# Volatile fields at a body's end (Dialect.volatile_fields: Codex's client_metadata, ~1 KB) are
# looked for in its last VOLATILE_BYTES, at most VOLATILE_CANDIDATES places parsed: a body that
# sends more, or hides their name in them often, is parsed whole.
VOLATILE_BYTES, VOLATILE_CANDIDATES = 64 * 1024, 8
# A run's first request has no reply to name its run by: it is kept in a slot of its session's (or
# tenant's) opening key, where its second request looks. A session's threads start close together
# (Claude Code's main thread, a subagent it calls at once, its side requests): a slot each.
OPENING_SLOTS = 4
LARGEST = 2  # one body may take 1/LARGEST of the budget (turn 1,000 of the bench's agent: 2.5 MB, 7.7 MB held)
SKIP_AFTER, RETRY_EVERY = 2, 8  # full parses in a row before a client's bodies are no longer split, and retries
# Separators of a body's transcript kept (the newest): where a request that sends its last items
# again, changed, may part from the previous one. A full parse finds one before the last RESENT
# items (Claude Code moves its cache breakpoints, on the newest one or two messages, every turn).
MAX_SEPARATORS = 8
RESENT = 4
# JSON's strings and structural bytes: a transcript array's separators, read from a known element start.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.S)
COMMA, QUOTE, OPENERS = ord(","), ord('"'), (ord("["), ord("{"))


# The first reply in a request's bytes (a role's value): what comes before it names a run of an
# unmodified agent. A dialect whose replies start otherwise says how (`Dialect.reply_markers`).
REPLY_MARKERS = (b'"assistant"',)


def run_fingerprint(raw: bytes, markers: tuple[bytes, ...] = REPLY_MARKERS) -> int | None:
    """What names a client's run in its request's bytes before they are read, when it names no
    conversation (the zero-code-change client, whose conversation id is derived from its system
    prompt and task once the body is parsed; a thread of a client's session, which the session
    id alone does not tell from its other threads): its bytes up to its first reply (the first of
    `markers`, JSON tokens no string's content can hold: its quotes would be escaped), the same on
    every later turn of the run whatever the client's JSON spacing. None for a run's first
    request (no reply yet): nothing names it apart from other runs' first requests, so it is kept
    in a slot of its session's or tenant's opening key, where its second request looks when its
    own key holds nothing (`BodyCache.opening_slot`). Two runs with the same start share a key: each then costs a
    full parse, never a wrong one (bodies are compared by bytes). O(bytes up to the first reply)
    for the first marker, each next one searched only before it (a marker no reply holds would
    cost a scan of the whole body)."""
    at = len(raw)
    for marker in markers:
        found = raw.find(marker, 0, at)
        if found >= 0:
            at = found
    return hash(raw[:at]) if at < len(raw) else None


# A body's transcript array -> the transcript's items, where a dialect makes several of one element
# (Messages: a user message's tool_result blocks, see dialects/messages.py); message by message,
# so that parts(a + b) == parts(a) + parts(b). None: the array is the transcript.
Parts = Callable[[list[Any]], list[Any]]


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """A request body as the handler reads it. When `reused` > 0, the first `reused` transcript
    items are the very objects of `origin`'s (the conversation's previous request), whose bytes
    they repeat: `hashes` are theirs, and nothing else of the body differs from that request but
    its dialect's volatile fields (`Dialect.volatile_fields`), which decide nothing of the prompt."""

    body: dict[str, Any]
    reused: int = 0
    origin: BodyEntry | None = None
    entry: BodyEntry | None = None  # what the next request of the same client is compared with
    key: Any = None  # the BodyCache key it was read under
    fresh: int | None = None  # bytes of the body that are new (None: all of it)

    @property
    def hashes(self) -> list[str]:
        return self.origin.hashes[: self.reused] if self.origin is not None else []


_NO_BYTES = memoryview(b"")  # what an entry out of the cache holds instead of its body (BodyEntry.let_go)

# A separator of a transcript array: (the offset of its comma in the body, the index of the element after it).
Separator = tuple[int, int]


@dataclass(slots=True)
class BodyEntry:
    """One request body, split where its transcript array closes: `head` (everything before the
    closing bracket, the items included) and `tail` (the bracket and everything after it).
    `head` is a view of the body's bytes, not a copy: a 2 MB body is not copied again each turn.
    `separators`: some of its transcript's separators, in order (the newest few), proven with
    the split (`proven`)."""

    head: memoryview
    tail: bytes
    body: dict[str, Any]
    raws: list[Any]  # the transcript's items: the body's array, or its parts (see Parts)
    hashes: list[str] = field(default_factory=list)  # set once the request was checked
    separators: tuple[Separator, ...] = ()
    # Where the transcript closes (and the separator) is proven by a second parse, after the
    # turn that parsed it whole (BodyCache.prove_soon: the next request finds it done) or, at the
    # latest, when a request first extends the body. Entries made from one are proven.
    proven: bool = True
    proving: asyncio.Future[bool] | None = None  # that proof, while it runs
    # Its system prompt and tools with their hashes (request_parts.py), by kind: a body that extends
    # this one and holds the same objects there reuses them.
    request_parts: dict[str, Any] | None = None
    # What was worked out from the body outside its transcript, by what it depends on besides (the
    # tokens its tools and instructions make, for a model): a body that extends this one has the
    # same bytes there (ParsedBody.reused), so the same facts.
    derived: dict[Any, Any] = field(default_factory=dict)
    conversation: Any = None  # the conversation whose turn it was kept for (BodyCache.remember)

    @property
    def size(self) -> int:
        """Its memory: the bytes kept, the parsed objects and the items' hashes."""
        return (len(self.head) + len(self.tail)) * (1 + PARSED) + HASH_BYTES * len(self.raws)

    def let_go(self) -> None:
        """Out of the cache: its body's bytes are never compared again, so they go now rather than
        with the last object that still names this entry (the turn that extended it, and the fast
        path's memo of that turn, until the turn's end: a whole body per turn in flight)."""
        self.head, self.tail = _NO_BYTES, b""


class BodyCache:
    """The previous request body of each recent client conversation, to parse only what is new.

    A full-history client resends its last request with new transcript items appended: the same
    bytes up to where the transcript array closed, then `,` and the new items, then the same
    bytes after it. Such a body is recognised by bytes (`startswith`/`endswith`, memcmp speed)
    and only its new items are parsed, as one small array; the rest is the previous request's
    parsed objects. JSON is context-free, so items appended where the array closed parse exactly
    as they would in the whole body. A client that sends its last items again changed (Claude
    Code moves its cache breakpoint to the newest message: the one before loses it) repeats the
    previous body up to a separator of its transcript instead: the items after it are parsed, the
    ones before are the previous request's (`reused` says how many). Anything else (an edited
    byte further back, a changed parameter) is parsed whole. Where the transcript closes, and a
    separator before its last items, are found once per full parse, and proven by parsing the
    body with an item inserted at each (`_prove`): after the turn (`prove_soon`), or when a
    request would extend it first; later separators are read off bytes known to be elements
    (`_separators`).

    Keyed by what names a client's conversation before the body is read (tenant, wire format,
    the conversation id it names, else its session id if it names one and its run's
    `run_fingerprint`: a session's threads take turns); bounded by the bytes held,
    least recently used out first.
    """

    def __init__(
        self, max_bytes: int = BODY_BYTES, enabled: bool = True, on_evict: Callable[[BodyEntry], None] | None = None
    ) -> None:
        self.max_bytes, self.enabled, self.on_evict = max_bytes, enabled, on_evict  # on_evict: what else lets go
        self._entries: OrderedDict[Any, BodyEntry] = OrderedDict()
        self._held = 0
        # Full parses in a row under a key: a client whose bodies never extend the last one (one
        # that rewrites its history further back than RESENT items every turn) gets no entry (its
        # memory, and finding where each transcript closes) but every RETRY_EVERY-th time.
        self._misses: OrderedDict[Any, int] = OrderedDict()
        self._proofs: set[asyncio.Future[bool]] = set()  # prove_soon's, under way
        self._slots: OrderedDict[Any, int] = OrderedDict()  # each opening key's next slot (opening_slot)
        self._homes: OrderedDict[Any, Any] = OrderedDict()  # each recent conversation's key (remember)

    async def extend(
        self, key: Any, raw: bytes, transcript_key: str, parts: Parts | None = None, opening: Any = None,
        volatile: frozenset[str] = frozenset(),
    ) -> ParsedBody | None:
        """`raw` read as the previous request under `key` plus new transcript items, its last
        ones perhaps sent again changed (parsed here, on the loop: at most OFFLOAD_BYTES of
        them), or None: it must be parsed whole. When `key` holds nothing, the first requests
        kept in `opening`'s slots are tried (`opening_slot`): the one `raw` extends is its run's
        from now on, moved to `key`. `volatile`: the dialect's fields that may differ at the end
        of a body that otherwise extends the last one (`_retailed`)."""
        if not self.enabled:
            return None
        found = self._entries.get(key)
        tried = [(key, found)] if found is not None or opening is None else [
            (slot, self._entries.get(slot)) for slot in ((opening, n) for n in range(OPENING_SLOTS))
        ]
        for held, previous in tried:  # held: the key it is found under
            if previous is not None and len(raw) - len(previous.head) - len(previous.tail) <= OFFLOAD_BYTES:
                extended = _extend(previous, raw, transcript_key, key, parts, volatile)
                if extended is not None:
                    break
        else:
            return None
        if not previous.proven:
            head, separators = previous.head, previous.separators
            proving = previous.proving  # the proof after its turn, still running: waited for, not made again
            if not await (asyncio.shield(proving) if proving is not None else self._prove(held, previous, transcript_key)):
                return None
            if previous.head is not head or previous.separators != separators:  # it splits elsewhere
                extended = _extend(previous, raw, transcript_key, key, parts, volatile)
        if extended is not None:
            if held is not key:  # a run's first request, extended by its second: its run's from now on
                if self._entries.get(held) is not previous or key in self._entries:
                    return None  # the cache changed while a proof was awaited
                self._entries[key] = self._entries.pop(held)
                self._misses.pop(held, None)
            self._entries.move_to_end(key)
            self._misses.pop(key, None)
        return extended

    def opening_slot(self, opening: Any) -> tuple[Any, int]:
        """The key a run's first request is kept under (no reply names its run yet): the next of
        `opening`'s OPENING_SLOTS, in turn, where its second request looks (`extend`)."""
        slot = self._slots.pop(opening, 0)
        self._slots[opening] = (slot + 1) % OPENING_SLOTS
        if len(self._slots) > MAX_BODIES:
            self._slots.popitem(last=False)
        return (opening, slot)

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

    def remember(self, key: Any, parsed: ParsedBody, hashes: list[str], conversation: Any = None) -> None:
        """Keep `parsed` (its transcript checked, `hashes` its items' hashes) for the next request,
        the one body of `conversation` kept: a run whose first bytes changed (a client that turns
        to streaming or to another model: its run's key is its bytes up to its first reply)
        left its last body under a key no request of it looks up again, which would fill the
        budget until the least recently used went (4 MB over the bench's 20 agents)."""
        if conversation is not None:
            self._move_home(conversation, key)
        entry = parsed.entry
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size
            if old is not entry:
                old.let_go()
        if entry is None or len(hashes) != len(entry.raws) or not self.enabled:
            return
        entry.hashes = hashes
        entry.conversation = conversation
        self._entries[key] = entry
        self._held += entry.size
        while self._held > self.max_bytes or len(self._entries) > MAX_BODIES:
            _, evicted = self._entries.popitem(last=False)
            self._held -= evicted.size
            if self.on_evict is not None:
                self.on_evict(evicted)
            evicted.let_go()

    def _move_home(self, conversation: Any, key: Any) -> None:
        """`conversation`'s body is kept under `key` from now on: the one kept under another key
        for it goes (one that key holds for another conversation now stays)."""
        home = self._homes.pop(conversation, None)
        if home is not None and home != key and (old := self._entries.get(home)) is not None and old.conversation == conversation:
            self.forget(home)
        self._homes[conversation] = key
        if len(self._homes) > MAX_BODIES:
            self._homes.popitem(last=False)

    def prove_soon(self, key: Any, transcript_key: str) -> None:
        """Prove where the body kept under `key` splits, as a task of its own, if it was parsed
        whole and is not proven yet. Called once its turn has answered: the proof (a second parse
        of the body, ~0.3 ms for 200 KB) runs while the client works on the reply, not on the
        next request's path. A body no request extends (a conversation's only turn) pays it too."""
        entry = self._entries.get(key)
        if entry is None or entry.proven or entry.proving is not None:
            return
        entry.proving = asyncio.ensure_future(self._prove(key, entry, transcript_key, later=True))
        self._proofs.add(entry.proving)
        entry.proving.add_done_callback(self._proofs.discard)

    async def _prove(self, key: Any, entry: BodyEntry, transcript_key: str, later: bool = False) -> bool:
        """Prove `entry` (under `key`) where it splits (`_prove`, in a thread for a large body),
        moving its split if it proves elsewhere; False if it can't be (then it is let go) or it
        was let go of meanwhile. `later`: after a pass of the loop (a turn's handler writes its
        response once the turn is over, without waiting)."""
        if later:
            await asyncio.sleep(0)
        split = await off_loop(len(entry.head), _prove, entry, transcript_key)
        if self._entries.get(key) is not entry:
            return False
        if split is None:
            self.forget(key)
            return False
        if split[0] is not entry.head or split[2] != entry.separators:  # it splits elsewhere
            entry.head, entry.tail, entry.separators = split
        entry.proven = True
        return True

    async def idle(self) -> None:
        """Wait for the proofs under way (shutdown, tests)."""
        while self._proofs:
            await asyncio.gather(*self._proofs, return_exceptions=True)

    @property
    def held(self) -> int:
        """The memory its entries take (`BodyEntry.size`), at most `max_bytes`."""
        return self._held

    def forget(self, key: Any) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size
            old.let_go()


def _extend(
    previous: BodyEntry, raw: bytes, transcript_key: str, key: Any, parts: Parts | None,
    volatile: frozenset[str] = frozenset(),
) -> ParsedBody | None:
    """`raw` as `previous` with items appended to its transcript, or with its items from one of
    its separators on sent again (changed) and new ones after them; None if it is neither. Its
    tail may differ from `previous`'s in the values of `volatile` fields alone (`_retailed`)."""
    head, tail = previous.head, previous.tail
    # Nearly the whole body compared once (memcmp): up to the oldest separator kept, or all of it.
    separators = previous.separators
    base = separators[0][0] if separators else len(head)
    if len(raw) < base + len(tail) or not raw.startswith(head[:base]):
        return None
    changed: dict[str, Any] = {}
    if not raw.endswith(tail):
        retailed = _retailed(previous, raw, base, volatile) if volatile else None
        if retailed is None:
            return None
        tail, changed = retailed
    if len(raw) >= len(head) + len(tail) and raw.startswith(head[base:], base):
        return _appended(previous, raw, transcript_key, key, parts, tail, changed)
    return _resent(previous, raw, transcript_key, key, parts, tail, changed) if separators else None


def _retailed(previous: BodyEntry, raw: bytes, start: int, volatile: frozenset[str]) -> tuple[bytes, dict[str, Any]] | None:
    """`raw`'s tail (from its transcript's closing bracket) when it repeats `previous`'s but for
    the values of the `volatile` fields that close the body (Codex sends its `client_metadata`
    last, new every request): (its bytes, those fields' values), else None. Exact: the first
    such field's name is looked for from the end (a short needle: a long one, searched backwards,
    can cost n×m), the previous tail's bytes before it must stand right before it, and what
    follows must parse as those fields alone (a wrong place would leave a bracket unclosed there,
    or among the new items: either then fails to parse). Bounded: VOLATILE_BYTES, VOLATILE_CANDIDATES."""
    keys = list(previous.body)
    first = len(keys)
    while first > 0 and keys[first - 1] in volatile:
        first -= 1
    if first == len(keys):
        return None
    name = orjson.dumps(keys[first])
    cut = previous.tail.rfind(name)
    if cut <= 0:
        return None
    stable = previous.tail[:cut]  # the bracket, the fields before the volatile ones, a comma
    end = len(raw)
    for _ in range(VOLATILE_CANDIDATES):
        at = raw.rfind(name, max(start + len(stable), len(raw) - VOLATILE_BYTES), end)
        if at < 0:
            return None
        if raw.startswith(stable, at - len(stable)):
            try:
                fields = orjson.loads(b"{" + raw[at:])
            except ValueError:
                fields = None  # the name inside a value (its own key again): look further back
            if type(fields) is dict and list(fields) == keys[first:]:
                return raw[at - len(stable) :], fields
        end = at
    return None


def _appended(
    previous: BodyEntry, raw: bytes, transcript_key: str, key: Any, parts: Parts | None, tail: bytes,
    changed: dict[str, Any],
) -> ParsedBody | None:
    """`raw` (which starts with `previous.head` and ends with `tail`: its own, or one whose
    volatile fields are `changed`) as `previous` with items appended."""
    head = previous.head
    middle = raw[len(head) : len(raw) - len(tail)]
    added = middle.lstrip(JSON_SPACE)
    separators = previous.separators
    if not added:
        new: list[Any] = []
    elif added[:1] == b"," and previous.raws:
        try:
            new = orjson.loads(b"[" + added[1:] + b"]")
        except ValueError:
            return None
        if not new:  # a comma and nothing after it: not JSON
            return None
        comma = len(head) + len(middle) - len(added)  # before the first new item: a separator, known for free
        separators = (*separators, (comma, len(previous.body[transcript_key])))[-MAX_SEPARATORS:]
    else:
        return None
    raws = previous.raws + (new if parts is None else parts(new)) if new else previous.raws
    listed = previous.body[transcript_key]
    body = {**previous.body, **changed, transcript_key: raws if parts is None else listed + new if new else listed}
    entry = BodyEntry(memoryview(raw)[: len(raw) - len(tail)] if new else head, tail, body, raws, separators=separators)
    return ParsedBody(body, len(previous.raws), previous, entry, key, fresh=len(middle))


def _resent(
    previous: BodyEntry, raw: bytes, transcript_key: str, key: Any, parts: Parts | None, tail: bytes,
    changed: dict[str, Any],
) -> ParsedBody | None:
    """`raw` (which ends with `tail`, as `_appended`'s, and repeats its bytes up to its oldest separator
    kept) as `previous` up to its newest separator `raw` repeats, then other items: the ones
    after that separator sent again (changed) and new ones. JSON is context-free: after a
    separator of the array, any items and the same closing bracket and tail parse as they would
    in the whole body."""
    head, separators = previous.head, previous.separators
    base = separators[0][0]
    at = len(separators) - 1  # the newest kept separator `raw` repeats the bytes up to (its comma included)
    while at >= 0 and not raw.startswith(head[base : separators[at][0] + 1], base):
        at -= 1
    if at < 0:
        return None
    kept = list(separators[: at + 1])
    # The separators after it (up to the next one kept, or the array's end), read off the previous
    # body: the items from `kept[-1]` on are elements, so their bytes are read from a known start.
    # Their count is known: the last element's bytes (Claude Code's newest message, most of what
    # it sends again) hold none and are not scanned.
    listed = previous.body[transcript_key]
    stop, last = (separators[at + 1][0], separators[at + 1][1]) if at + 1 < len(separators) else (len(head), len(listed))
    for separator in _separators(head, kept[-1][0] + 1, stop, kept[-1][1], last - kept[-1][1] - 1, listed):
        if not raw.startswith(head[kept[-1][0] : separator[0] + 1], kept[-1][0]):
            break
        kept.append(separator)
    comma, index = kept[-1]
    end = len(raw) - len(tail)
    if end - comma > OFFLOAD_BYTES:
        return None
    try:
        new = orjson.loads(b"[" + raw[comma + 1 : end] + b"]")
    except ValueError:
        return None
    if not new:  # a comma and nothing after it: not JSON
        return None
    reused = index if parts is None else len(previous.raws) - len(parts(listed[index:]))
    raws = previous.raws[:reused] + (new if parts is None else parts(new))
    body = {**previous.body, **changed, transcript_key: raws if parts is None else listed[:index] + new}
    entry = BodyEntry(memoryview(raw)[:end], tail, body, raws, separators=tuple(kept[-MAX_SEPARATORS:]))
    return ParsedBody(body, reused, previous, entry, key, fresh=end - comma)


def _separators(data: Any, start: int, end: int, index: int, most: int, elements: list[Any] | None = None) -> list[Separator]:
    """The first `most` separators of a transcript array in `data[start:end]`, which starts where
    element `index` does and holds whole elements (bytes of a body known to be valid JSON): the
    scan ends at the last one asked for. `elements`: the array parsed; an element whose bytes are
    its compact JSON (orjson's dump, as JavaScript and httpx clients send) ends where that dump
    does, found by one compare (an object or array closes where its bytes say, whatever follows);
    the others are scanned token by token (a tool output full of escapes: ~15 ns a byte)."""
    out: list[Separator] = []
    if most <= 0:
        return out
    if elements is not None:
        start, index = _dumped_separators(data, start, end, index, most, elements, out)
        if len(out) == most:
            return out
    depth = 0
    for token in _TOKENS.finditer(data, start, end):
        byte = data[token.start()]
        if byte == QUOTE:
            continue
        if byte == COMMA:
            if depth == 0:
                index += 1
                out.append((token.start(), index))
                if len(out) == most:
                    break
        elif byte in OPENERS:
            depth += 1
        else:
            depth -= 1
    return out


def _dumped_separators(
    data: Any, start: int, end: int, index: int, most: int, elements: list[Any], out: list[Separator]
) -> tuple[int, int]:
    """`_separators` by each element's dump: appends to `out` the separators found, and returns
    where (and at which element) the first element that is not its dump starts."""
    at = start
    while len(out) < most and index < len(elements):
        while at < end and data[at] in JSON_SPACE:
            at += 1
        value = orjson.dumps(elements[index])
        stop = at + len(value)
        # bytes(): a memoryview compares a byte at a time, a copy and bytes' == is a memcmp
        if value[0] not in OPENERS or stop > end or bytes(data[at:stop]) != value:
            break
        while stop < end and data[stop] in JSON_SPACE:
            stop += 1
        if stop >= end or data[stop] != COMMA:
            break
        index += 1
        out.append((stop, index))
        at = stop + 1
    return at, index


def _entry(raw: bytes, body: Any, transcript_key: str, parts: Parts | None = None) -> BodyEntry | None:
    """Where `raw`'s transcript array likely closes, to be proven (`_prove`): None when it can't
    be found or isn't a non-empty array of the body (or what follows it is nested too deeply to
    compare)."""
    if not isinstance(body, dict) or not isinstance(raws := body.get(transcript_key), list) or not raws:
        return None
    try:
        entry = _closed_at(raw, body, transcript_key, raws, prove=False)
    except RecursionError:
        return None
    if entry is not None and parts is not None:
        entry.raws = parts(raws)
    return entry


def _prove(entry: BodyEntry, transcript_key: str) -> tuple[memoryview, bytes, tuple[Separator, ...]] | None:
    """Where `entry`'s body really splits (head, tail, separators): its own split if proven (its
    separator dropped if that alone is not), else where the transcript proves to close, or None.
    One parse; more only for a body made to mislead (a later key's array that looks like the
    transcript's end). Pure, for a thread: the caller applies it."""
    raw = bytes(entry.head) + entry.tail
    end, body = len(entry.head), entry.body
    if entry.separators and _proven(raw, end, body, transcript_key, entry.separators[-1]):
        return entry.head, entry.tail, entry.separators
    if _proven(raw, end, body, transcript_key):
        return entry.head, entry.tail, ()
    try:
        found = _closed_at(raw, body, transcript_key, body[transcript_key], prove=True)
    except RecursionError:
        return None
    return (found.head, found.tail, found.separators) if found is not None else None


def _closed_at(raw: bytes, body: dict[str, Any], transcript_key: str, raws: list[Any], prove: bool) -> BodyEntry | None:
    """The body split where its transcript array closes: the first candidate from the end whose
    rest reads as the body's later keys, with a separator before its last items; `prove`: the
    first candidate that proves to be it (see `_proven`)."""
    keys = list(body)
    after = {k: body[k] for k in keys[keys.index(transcript_key) + 1 :]}
    end = len(raw)
    for _ in range(MAX_CANDIDATES):
        end = raw.rfind(b"]", 0, end)
        if end < 0:
            return None
        rest = raw[end + 1 :].lstrip(JSON_SPACE)
        if not _closes_transcript(rest, after):
            continue
        separator = _separator_before_last(raw, end, raws)
        separators = (separator,) if separator is not None else ()
        if not prove:
            return BodyEntry(memoryview(raw)[:end], raw[end:], body, raws, separators=separators, proven=False)
        # One parse proves both where the array closes and a separator before its last items.
        if separator is not None and _proven(raw, end, body, transcript_key, separator):
            return BodyEntry(memoryview(raw)[:end], raw[end:], body, raws, separators=separators)
        if _proven(raw, end, body, transcript_key):
            return BodyEntry(memoryview(raw)[:end], raw[end:], body, raws)
    return None


def _separator_before_last(raw: bytes, end: int, elements: list[Any]) -> Separator | None:
    """A likely separator before the last RESENT elements of the array closing at `end` (fewer
    when it has fewer): a comma before a `{` whose bytes up to `end` parse as those elements.
    Found by trying (a comma in a string can look like one); the caller proves it."""
    n = len(elements)
    want = min(RESENT, n - 1)
    if want < 1:
        return None
    at, tried = end, 0
    for _ in range(8 * MAX_CANDIDATES):  # braces looked at; of them, MAX_CANDIDATES parsed from
        at = raw.rfind(b"{", 0, at)
        if at <= 0 or tried == MAX_CANDIDATES:
            return None
        comma = at - 1
        while comma > 0 and raw[comma] in JSON_SPACE:
            comma -= 1
        if raw[comma] != COMMA:
            continue
        tried += 1
        try:
            suffix = orjson.loads(b"[" + raw[comma + 1 : end] + b"]")
        except ValueError:
            continue
        if len(suffix) < n and suffix == elements[n - len(suffix) :] and len(suffix) >= want:
            return comma, n - len(suffix)
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


def _proven(
    raw: bytes, end: int, body: dict[str, Any], transcript_key: str, separator: Separator | None = None
) -> bool:
    """An item inserted at `end` lands last in the transcript (so it changes nothing else: the
    bytes differ there only); with `separator`, one inserted after its comma lands at its index
    too. Inserted anywhere else (in a string, a nested array, an earlier duplicate of the
    transcript's key, a later key's value) the transcript would not gain an item 0 there."""
    if separator is None:
        probe_raw = raw[:end] + b",0" + raw[end:]
    else:
        comma = separator[0] + 1
        probe_raw = raw[:comma] + b"0," + raw[comma:end] + b",0" + raw[end:]
    try:
        probe = orjson.loads(probe_raw)
    except ValueError:
        return False
    items = probe.get(transcript_key) if isinstance(probe, dict) else None
    added = 1 if separator is None else 2
    if not isinstance(items, list) or len(items) != len(body[transcript_key]) + added or not _zero(items[-1]):
        return False
    return separator is None or _zero(items[separator[1]])


def _zero(value: Any) -> bool:
    return type(value) is int and value == 0
