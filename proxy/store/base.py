"""The store interface every backend implements, and the records it holds.

A conversation is an append-only log of messages: transcript items (`transcript.Raw`) in the wire
form their dialect read them in (a chat message, a Responses input item, an Anthropic or Gemini
message), kept and given back as they are; the store reads one only to search its text. A
message's content never changes once written; only its status does (pending -> live | failed,
live -> superseded, ...). The live transcript is the live messages in sequence order; the
trajectory is every message ever written.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import ProxyError
from ..identity import ConversationKey, family_of
from ..marks import RUNS_MARK, THREAD_MARK
from ..transcript import Raw
from ..seqruns import SeqRuns
from ..titles import title_from_task

# Staged before forwarding, durable before the reply's first byte; becomes live when the upstream
# accepts the request, failed otherwise.
PENDING = "pending"
LIVE = "live"
SUPERSEDED = "superseded"  # the client diverged (edited or regenerated) after this point
FAILED = "failed"  # the request carrying it was refused or failed: kept in the trajectory only
INCOMPLETE = "incomplete"  # a streamed reply the client went away from
INTERNAL = "internal"  # a read_tool_output round the proxy answered itself: never shown to the client
STATUSES = frozenset({PENDING, LIVE, SUPERSEDED, FAILED, INCOMPLETE, INTERNAL})


def now() -> float:
    return time.time()


# -- faults ----------------------------------------------------------------------------------------
# A store that cannot write is the operator's problem, not a bug: the client gets a clear error it
# may retry, never a 500, and /healthz says so until a write succeeds again.


class StoreError(ProxyError):
    """The store failed an operation; the client may retry once the store is back."""

    status = 503
    type = "server_error"
    code = "store_unavailable"


class StoreUnavailable(StoreError):
    """The store cannot be reached (or failed to answer)."""


class StoreFull(StoreError):
    """No room left: the disk (diskcache) or memory (Redis maxmemory) is full. Deleting
    conversations still works and frees room."""

    status = 507
    code = "store_full"


class StoreReadOnly(StoreError):
    """The store refuses writes: a read-only filesystem or file, or a Redis replica."""

    code = "store_read_only"


OK = "ok"
HEALTH_STATES = {StoreFull: "full", StoreReadOnly: "read_only", StoreUnavailable: "unavailable"}


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What /healthz says of the store: "ok", or why not ("full", "read_only", "unavailable")."""

    status: str = OK
    detail: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # e.g. free space, the reserve

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_api(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, **self.facts}


class WriteHealth:
    """The outcome of the store's latest write: a failure is remembered until a write succeeds."""

    def __init__(self) -> None:
        self.failure: StoreError | None = None
        self.failures = 0  # writes failed since start

    def failed(self, exc: StoreError) -> None:
        self.failure = exc
        self.failures += 1

    def succeeded(self) -> None:
        self.failure = None

    def health(self, **facts: Any) -> StoreHealth:
        facts["write_failures"] = self.failures
        return StoreHealth(OK, None, facts) if self.failure is None else failed_health(self.failure, **facts)


def failed_health(exc: StoreError, **facts: Any) -> StoreHealth:
    """The health of a store that just failed with `exc`."""
    state = next((name for cls, name in HEALTH_STATES.items() if isinstance(exc, cls)), "unavailable")
    return StoreHealth(state, exc.message, facts)


@dataclass(slots=True)
class StoredMessage:
    seq: int
    message: Raw  # the item as its dialect's codec reads it (Codec.items), whatever the wire format
    hash: str
    status: str
    created_at: float

    def to_api(self, *, with_status: bool) -> dict[str, Any]:
        out = {**self.message, "seq": self.seq, "created_at": self.created_at}
        if with_status:
            out["status"] = self.status
        return out


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One passage found: where it is (the message's seq, and the passage's character offset in
    the message's text), what it says with a little context around it, and its score."""

    seq: int
    role: str
    created_at: float
    text: str  # the passage with up to search.CONTEXT_CHARS on each side, cut at lines where it can be
    offset: int  # where `text` starts in the message's text (for read_tool_output)
    length: int  # the message text's whole length
    score: float


@dataclass(slots=True)
class KeyFact:
    """An identifier a summary keeps verbatim (a path, URL, id, sha, number), with its salience."""

    value: str
    named: int  # messages in which the user, the assistant or a tool call's arguments named it
    seen: int  # tool outputs it appeared in
    last_seq: int  # the newest message that mentions it


@dataclass(slots=True)
class QuotedMessage:
    """A user message a summary carries verbatim ("What the user said"), or its head and a ref."""

    seq: int
    text: str  # the whole text, or only its head when `ref` is set
    chars: int  # the length of the whole text
    ref: str | None = None  # set when shortened: read_tool_output reads the whole message by it

    @property
    def shortened(self) -> bool:
        return self.ref is not None


@dataclass(slots=True)
class Summary:
    """A compaction summary: what the live history up to `last_seq` was, for the agent.

    Its parts are kept apart: `text` is the summarizer's, `facts` and `user_messages` the proxy's
    own (carried forward from summary to summary). proxy/compaction/render.py makes them the one
    system message the upstream sees."""

    text: str
    first_seq: int  # the window of live messages it covers (with the previous summary folded in)
    last_seq: int
    strategy: str
    model: str
    tokens_in: int  # what the summarizer spent
    tokens_out: int
    created_at: float = field(default_factory=lambda: now())
    id: int = 0  # set by the store: 1, 2, ... per conversation
    facts: list[KeyFact] = field(default_factory=list)  # most salient first
    user_messages: list[QuotedMessage] = field(default_factory=list)  # oldest first
    user_messages_omitted: int = 0  # older user messages past every budget: counted, not shown

    def to_record(self) -> dict[str, Any]:
        """The JSON-safe form both store backends keep."""
        return asdict(self)

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> Summary:
        """The inverse of `to_record`; a record written before facts and user messages were kept
        as data reads with none."""
        fields = dict(raw)
        fields["facts"] = [KeyFact(**f) for f in fields.get("facts") or ()]
        fields["user_messages"] = [QuotedMessage(**m) for m in fields.get("user_messages") or ()]
        return cls(**fields)

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation.summary",
            "text": self.text,
            "key_facts": [f.value for f in self.facts],
            "user_messages": [asdict(m) for m in self.user_messages],
            "user_messages_omitted": self.user_messages_omitted,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "strategy": self.strategy,
            "model": self.model,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "created_at": self.created_at,
        }


@dataclass(slots=True)
class Conversation:
    key: ConversationKey
    created_at: float
    updated_at: float
    next_seq: int = 1
    # (seq, hash) of the live transcript in order: enough to dedupe a request without reading messages.
    # A snapshot's lists and dicts are read-only: the embedded store shares them with its record.
    live: list[tuple[int, str]] = field(default_factory=list)
    llm_calls: int = 0  # upstream calls made for this conversation (the quota counts these)
    # seq -> llm_calls when that message was first forwarded: its quota figures never change after.
    first_forwarded: dict[int, int] = field(default_factory=dict)
    rewritten: frozenset[int] = frozenset()  # seqs with a stored rewrite (e.g. a tool-output summary)
    # Compaction: live messages up to `boundary` go upstream as summary `summary_id` instead.
    boundary: int = 0
    summary_id: int | None = None
    # Where the pipeline's cuts stand between turns (the window's start, mask's boundary), so each
    # prompt extends the previous one until the next cut: name -> seq.
    marks: dict[str, int] = field(default_factory=dict)
    # What a person reads in the list, kept by finish_turn from the turn records (see TurnFacts)
    # and by set_title.
    title: str | None = None  # set by the client (X-Conversation-Title) or a person (PATCH)
    task: str | None = None  # the first words of the task, from the first turn that had one
    model: str | None = None  # the newest turn's
    client: str | None = None  # the newest turn's (from its User-Agent)
    failures: int = 0  # turns that failed (their record's status is failed)
    last_error: dict[str, Any] | None = None  # the newest failed turn's error, with its `turn`
    # Derived from what the store holds besides (the turn records, the inbox), for a turn to read
    # without another look-up; not part of a conversation's identity (nor of its export).
    turns: int = field(default=0, compare=False)  # turn records kept so far (the next turn is turns + 1)
    # Inbox: messages not yet delivered for good (pending, or delivered with an item of a turn not
    # yet ended), and the seqs inbox messages were delivered with (see InboxMessage).
    inbox_open: int = field(default=0, compare=False)
    inbox_anchors: frozenset[int] = field(default=frozenset(), compare=False)

    @property
    def live_hashes(self) -> list[str]:
        return [h for _, h in self.live]

    def description(self) -> dict[str, Any]:
        """The fields that describe it to people (not `turns`: a store counts its turn records)."""
        return {
            "title": self.title, "task": self.task, "model": self.model, "client": self.client,
            "failures": self.failures, "last_error": self.last_error,
        }

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.key.id,
            "object": "conversation",
            "tenant": self.key.tenant[:12],
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "message_count": len(self.live),
            "llm_calls": self.llm_calls,
            "boundary": self.boundary,
            "summary_id": self.summary_id,
            "title": self.title or title_from_task(self.task),  # its own, else the task's first words
            "task": self.task,
            "model": self.model,
            "client": self.client,
            "turns": self.turns,
            "failures": self.failures,
            "last_error": self.last_error,
            # The client session it is a thread of (its main thread's id), or None outside one.
            "family": family_of(self.key.id, is_thread=True) if THREAD_MARK in self.marks else None,
        }


# An inbox message's placement: appended to the text of the item it was delivered with (a tool
# result), or a user item of its own right before that item.
APPEND = "append"
BEFORE = "before"
# An inbox message's status as the store reports it. A delivery goes with its item: while that
# item's turn runs it is delivering; once the item is live it is delivered for good; if the turn
# fails (the item fails, or stays pending because its replica died) it is pending again.
INBOX_PENDING = "pending"
INBOX_DELIVERING = "delivering"
INBOX_DELIVERED = "delivered"
INBOX_STATUSES = frozenset({INBOX_PENDING, INBOX_DELIVERING, INBOX_DELIVERED})


@dataclass(slots=True)
class InboxMessage:
    """A message left for a running agent (`POST .../inbox`), and where it was delivered."""

    id: int  # 1, 2, ... per conversation
    content: str  # as the user wrote it
    note: str  # what goes upstream: `content` marked as the user's, fixed when posted (stable bytes)
    created_at: float
    status: str = INBOX_PENDING
    seq: int | None = None  # the item it was delivered with
    placement: str | None = None  # APPEND | BEFORE
    turn: int | None = None  # the turn whose prompt first carried it
    delivered_at: float | None = None

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation.inbox_message",
            "content": self.content,
            "status": self.status,
            "created_at": self.created_at,
            "delivered_at": self.delivered_at,
            "turn": self.turn,
            "seq": self.seq,
            "placement": self.placement,
        }


class InboxFull(Exception):
    """post_inbox: the conversation already holds the most undelivered messages allowed."""


@dataclass(slots=True)
class KnowledgeVersion:
    """One version of a tenant's long-term knowledge document (namespace "" = the default one)."""

    tenant: str
    namespace: str
    version: int  # 1, 2, ... per document; every one is kept
    text: str
    created_at: float
    source: str  # who wrote it: "seed", "admin", "api", "agent:<conversation id> turn <n>"

    def to_api(self, *, with_text: bool = True) -> dict[str, Any]:
        out = {
            "object": "knowledge.version",
            "namespace": self.namespace or None,
            "version": self.version,
            "created_at": self.created_at,
            "source": self.source,
            "chars": len(self.text),
        }
        if with_text:
            out["text"] = self.text
        return out


# What a request sends besides its transcript, kept once per conversation by hash (RequestPart).
SYSTEM_PART = "system"  # Messages' top-level `system`, Responses' `instructions` (chat's are messages)
TOOLS_PART = "tools"  # the client's tool definitions, as it sent them
PART_KINDS = frozenset({SYSTEM_PART, TOOLS_PART})


def part_json(value: Any) -> bytes:
    """A request part's value as hashed: its JSON with sorted keys (the same object in another
    key order is the same part)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson refuses (integers past 64 bits) but JSON allows
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def part_hash(value: Any) -> str:
    """The hash a request part is kept under."""
    return hashlib.sha256(part_json(value)).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class RequestPart:
    """A system prompt or tools list a turn of the conversation sent, kept once: turn records
    name it by `hash` (`system_hash`, `tools_hash`)."""

    kind: str  # SYSTEM_PART | TOOLS_PART
    hash: str  # part_hash(value)
    value: Any  # as the client sent it: a string, content blocks or an object (system), the tools array
    created_at: float = 0.0  # when the first turn that sent it was stored

    def to_api(self) -> dict[str, Any]:
        return {"object": "conversation.request_part", "kind": self.kind, "hash": self.hash,
                "value": self.value, "created_at": self.created_at}

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "hash": self.hash, "value": self.value, "created_at": self.created_at}

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> RequestPart:
        return cls(raw["kind"], raw["hash"], raw["value"], float(raw.get("created_at") or 0.0))


class ConversationExists(Exception):
    """import_conversation found the conversation already in the store (and was not told to replace it)."""


@dataclass(slots=True)
class ConversationDump:
    """Everything a store holds of one conversation: what export reads and import_conversation
    writes, so a conversation moves between stores losslessly (see proxy/transfer.py). Refs are
    not in it: they are derived from the key and seq under the store's own secret."""

    conversation: Conversation  # key, times, counters, first-forwarded marks, boundary, summary id, marks
    messages: list[StoredMessage]  # every message, seqs 1..n in order: statuses, hashes, times
    rewrites: dict[int, str]  # seq -> the stored forwarded form
    summaries: list[Summary]  # every summary, ids 1..k in order
    turns: list[dict[str, Any]]  # every turn record as turn_records() gives it (`turn` 1..t, `reply_seq`)
    responses: dict[str, int] = field(default_factory=dict)  # response id -> the seq it names (response_owner)
    inbox: list[InboxMessage] = field(default_factory=list)  # every inbox message, ids 1..k, as inbox() gives them
    parts: list[RequestPart] = field(default_factory=list)  # every system prompt and tools list, as request_parts() gives them

    def check(self) -> None:
        """Raise ValueError, naming the problem, unless the parts agree as a store's own would."""
        c, n = self.conversation, len(self.messages)
        problems = []
        if [m.seq for m in self.messages] != list(range(1, n + 1)) or c.next_seq != n + 1:
            problems.append("message seqs must run 1, 2, ... with next_seq after the last")
        if any(m.status not in STATUSES for m in self.messages):
            problems.append(f"a message status is not one of {sorted(STATUSES)}")
        if c.live != [(m.seq, m.hash) for m in self.messages if m.status == LIVE]:
            problems.append("the live transcript must be the messages whose status is live")
        named = set(c.first_forwarded) | set(self.rewrites)
        if not named <= set(range(1, n + 1)) or c.rewritten != frozenset(self.rewrites):
            problems.append("first-forwarded marks and rewrites must name stored messages")
        if [s.id for s in self.summaries] != list(range(1, len(self.summaries) + 1)):
            problems.append("summary ids must run 1, 2, ...")
        if not 0 <= c.boundary <= n or (c.summary_id is not None and not 1 <= c.summary_id <= len(self.summaries)):
            problems.append("the boundary must be a stored seq and the summary id a stored summary")
        if [r.get("turn") for r in self.turns] != list(range(1, len(self.turns) + 1)):
            problems.append("turn records must be numbered 1, 2, ...")
        if not set(self.responses.values()) <= set(range(1, n + 1)):
            problems.append("response ids must name stored messages")
        if not all(0 <= seq <= n for name, seq in c.marks.items() if name not in (THREAD_MARK, RUNS_MARK)):
            problems.append("marks must be seqs of the conversation")
        if not all(c.marks[name] >= 1 for name in {RUNS_MARK} & set(c.marks)):
            problems.append("the runs mark must count runs (1 or more)")
        if not 0 <= c.failures <= len(self.turns) or (c.failures > 0) != (c.last_error is not None):
            problems.append("failures must count failed turns, with the last one's error")
        if [m.id for m in self.inbox] != list(range(1, len(self.inbox) + 1)):
            problems.append("inbox message ids must run 1, 2, ...")
        if any((m.seq is None) != (m.placement is None) or (m.seq is not None and not 1 <= m.seq <= n)
               or m.placement not in (None, APPEND, BEFORE) or m.status not in INBOX_STATUSES for m in self.inbox):
            problems.append("an inbox message must be delivered with a stored message, appended or before it")
        problems += self._part_problems()
        if problems:
            raise ValueError(f"conversation {c.key}: " + "; ".join(problems))

    def _part_problems(self) -> list[str]:
        """What is wrong with the request parts: each kept once under the hash of its value, and
        every hash a turn record names among them."""
        hashes = [p.hash for p in self.parts]
        problems = []
        if any(p.kind not in PART_KINDS for p in self.parts) or len(set(hashes)) != len(hashes):
            problems.append(f"request parts must be of a kind in {sorted(PART_KINDS)}, each kept once")
        elif any(p.hash != part_hash(p.value) for p in self.parts):
            problems.append("a request part's hash must be the hash of its value")
        if any(not isinstance(p.value, list) and not (p.kind == SYSTEM_PART and isinstance(p.value, str | dict)) for p in self.parts):
            problems.append("a system part must be a string, a list of blocks or an object, a tools part a list")
        kinds = {p.hash: p.kind for p in self.parts}
        for record in self.turns:
            for kind in PART_KINDS:
                named = record.get(f"{kind}_hash")
                if named is not None and kinds.get(named) != kind:
                    problems.append(f"turn {record.get('turn')}: its {kind}_hash names no stored {kind} part")
                    break
        return problems


def check_statuses(*statuses: str) -> None:
    """Every status a write names is one the store knows (a ValueError otherwise: the caller's bug)."""
    unknown = set(statuses) - STATUSES
    if unknown:
        raise ValueError(f"unknown status {sorted(unknown)}")


@dataclass
class TurnRecord:
    """A finished turn as the engine hands it to the store: what went upstream and how it ended,
    for the trajectory, the replay page and the conversation list. `row()` is how every backend
    keeps it (and how exports carry it); the store adds `turn` and `reply_seq`."""

    status: str = LIVE
    created_at: float | None = None
    format: str | None = None  # the dialect's name
    model: str | None = None
    client: str | None = None  # from the User-Agent
    sent_seqs: SeqRuns = field(default_factory=SeqRuns)  # in prompt order (a list given is made runs)
    new_seqs: SeqRuns = field(default_factory=SeqRuns)
    tokens_sent: int | None = None
    tokens_sent_total: int = 0
    messages_left_out: int = 0
    truncated: int = 0
    masked: int = 0
    summary_id: int | None = None
    repairs: int = 0
    llm_calls: int | None = None
    llm_call_limit: int | None = None
    read_rounds: int = 0
    response_id: str | None = None  # where a later request may name the reply by it (Responses)
    inbox: list[int] = field(default_factory=list)  # inbox message ids the prompt delivered
    knowledge: dict[str, Any] | None = None
    system_hash: str | None = None  # the request parts it sent, by hash
    tools_hash: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {"status", "message", "source"} of a failed turn
    title: str | None = None  # X-Conversation-Title, kept only when given
    task: str | None = None  # the task's first words, on a conversation's first turns only

    def __post_init__(self) -> None:
        if type(self.sent_seqs) is not SeqRuns:
            self.sent_seqs = SeqRuns(self.sent_seqs)
        if type(self.new_seqs) is not SeqRuns:
            self.new_seqs = SeqRuns(self.new_seqs)

    def row(self) -> dict[str, Any]:
        """The record as exports and `Store.turn_records` give it: its seqs as lists."""
        return turn_row_read(self.stored_row())

    def stored_row(self) -> dict[str, Any]:
        """The record as every backend keeps it: each seq list as `{"runs": [first, count, ...]}`
        (the store adds `turn` and `reply_seq`). Shallow: `asdict` deep-copied every seq, ms a turn."""
        row = dict(self.__dict__)
        row["sent_seqs"], row["new_seqs"] = {"runs": self.sent_seqs.runs()}, {"runs": self.new_seqs.runs()}
        for optional in ("title", "task"):
            if not row[optional]:
                del row[optional]
        return row


SEQ_LISTS = ("sent_seqs", "new_seqs")  # a turn record's lists of seqs: kept as runs


def imported_turn_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An export's turn row (`row()`'s form, its seq lists checked: transfer.py) as backends keep
    it (`stored_row()`'s)."""
    stored = dict(row)
    for name in SEQ_LISTS:
        if isinstance(stored.get(name), list):
            stored[name] = {"runs": SeqRuns(stored[name]).runs()}
    return stored


def turn_row_read(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A kept turn row in `row()`'s form: runs made lists again (a row kept before runs has its
    lists, given as they are)."""
    row = dict(stored)
    for name in SEQ_LISTS:
        value = row.get(name)
        if isinstance(value, dict) and isinstance(value.get("runs"), list):
            row[name] = list(SeqRuns.from_runs(value["runs"]))
    return row


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """What a finished turn's record tells about its conversation: finish_turn keeps it there."""

    latest: dict[str, str]  # model, client, title: the newest turn's replace the conversation's
    task: str | None  # kept only while the conversation has none
    error: dict[str, Any] | None  # the turn failed: counted, and kept as the last error

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> TurnFacts:
        latest = {name: value for name in ("model", "client", "title") if isinstance(value := record.get(name), str) and value}
        task = record.get("task") if isinstance(record.get("task"), str) and record.get("task") else None
        error = None
        if record.get("status") == FAILED:
            given = record.get("error")
            error = dict(given) if isinstance(given, Mapping) and given else {"message": "failed"}
        return cls(latest, task, error)

    def last_error(self, turn: int, created_at: Any) -> dict[str, Any] | None:
        return None if self.error is None else {"turn": turn, "created_at": created_at, **self.error}


class TurnStore(Protocol):
    """What a turn writes and reads on its path (the engine, turns.py): one conversation's log,
    its marks and its quota count."""

    def lock(self, key: ConversationKey) -> AbstractAsyncContextManager[None]:
        """Serialize the writes of one conversation's turns: a turn holds it while it plans and
        writes its new items, and while it ends, never across its upstream call (proxy/turns.py)."""

    async def get(self, key: ConversationKey) -> Conversation | None: ...

    async def append(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        """Append transcript items (creating the conversation if new), one canonical hash each
        (the dialect's `hash`); returns their sequence numbers."""

    async def stage(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        """`append`, but durable only with the conversation's next write (a turn's end: one commit
        for the turn) or `flush(key)`, whichever comes first; seen at once by every read here. A
        backend may write them at once (Redis does, the embedded store does for a conversation it
        does not hold in memory, a large write, or a disk short of room). Lost if the process
        dies first, or with a write of this store that fails meanwhile: the turn's end then fails."""

    async def flush(self, key: ConversationKey) -> None:
        """Make what `stage` held of the conversation durable now (before a reply's first byte)."""

    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        """Change the status of messages by seq, in one atomic step."""

    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Raw, str]],
        reply_status: str,
        record: TurnRecord | None,
        *,
        llm_calls: int = 0,
        forwarded: Mapping[int, int] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> int | None:
        """End a turn in one atomic step: status changes, then the reply's items (message, hash)
        appended with `reply_status`, then the turn's record (what was sent upstream) kept; a
        record's `response_id` names the reply from then on (`response_owner`), and what it tells
        of the conversation (TurnFacts: model, client, title, task, a failure) is kept on the
        conversation, a failed one also listing it among the failed (`list_conversations(failed=True)`).
        The turn's `llm_calls` are counted (as `count_llm_call` would, one by one) and its
        `forwarded` marks recorded (as `mark_forwarded` would), and the named `marks` its stages
        moved set (as `set_marks` would): so a turn writes its new items (staged: see `stage`) and
        this, one commit where they waited for it. Returns the seq of the reply's first item (None
        without a reply)."""

    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        """The conversation id and the seq of the last item of the reply a turn record named by
        `response_id` (kept by finish_turn when the record has one); None if unknown."""

    async def count_llm_call(self, key: ConversationKey, limit: int | None = None) -> int | None:
        """Count one upstream call; returns the conversation's total so far, this one included.
        With `limit`, in the same atomic step, only while fewer than `limit` are counted: None
        (nothing counted) once they are (an exact quota for turns of one conversation at once)."""

    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        """Record, for messages forwarded for the first time, the call count at that moment."""

    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        """Set named marks on the conversation record (others stay as they are)."""

    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        """Store the forwarded form of messages (by seq), so every later turn sends the same bytes."""

    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]: ...

    async def add_request_parts(self, key: ConversationKey, parts: Sequence[RequestPart]) -> list[str]:
        """Keep each part not kept yet (by hash), in one atomic step, stamped now; returns the
        hashes newly kept (none: nothing was written). A conversation not stored gets nothing."""


class HistoryStore(Protocol):
    """A conversation's past as the agent's recall tools, the trajectory and exports read it."""

    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        """Messages in sequence order, optionally only those after seq `after`, at most `limit`."""

    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None: ...

    async def search(self, key: ConversationKey, query: str, *, limit: int = 5) -> list[SearchHit]:
        """The passages of the conversation's live messages (those a compaction covers included;
        never superseded, failed or internal ones, never another conversation's) that best match
        `query` (BM25 over passages of a few lines, identifiers matched whole), best first, at most
        `limit` (1..20), one per message. Both backends answer from an index derived from their own
        log (see search.py)."""

    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The records of finished turns, oldest first (each has `turn`, 1, 2, ...), after turn `after`."""

    async def request_parts(self, key: ConversationKey, *, after: int = 0) -> list[RequestPart]:
        """The parts the conversation kept, in the order first kept, after the first `after` of them."""

    # -- inbox ---------------------------------------------------------------------------------


class SummaryStore(Protocol):
    """The summaries compaction keeps."""

    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        """Keep a new summary (every one is kept, for audit) and make it current: the boundary moves to
        `summary.last_seq`. Returns it with its id. A summary whose window ends at or before the
        current boundary is kept but does not become current (the boundary never moves back)."""

    async def summaries(self, key: ConversationKey) -> list[Summary]:
        """Every summary of the conversation, oldest first."""

    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None: ...


class AdminStore(Protocol):
    """What people do to conversations through the admin API and the CLI."""

    async def list_conversations(
        self, tenant: str | None, *, after: str | None = None, limit: int = 20, failed: bool = False
    ) -> tuple[list[Conversation], bool]:
        """Newest first; `tenant=None` lists every tenant (admin); `failed` only those with a failed
        turn. Returns (page, has_more)."""

    async def find(self, conversation_id: str) -> list[Conversation]:
        """Every tenant's conversation with this id (admin look-ups)."""

    async def delete(self, key: ConversationKey) -> bool: ...

    async def set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        """Give the conversation a title of its own (None: none, the task's words again); returns
        it, or None (and creates nothing) if there is no such conversation."""

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        """Write a whole conversation read from another store, under its own key, in one atomic
        step (it lists as the newest; its response ids name it). Raises ValueError for a dump that
        does not `check()`, and ConversationExists when the key is taken, unless `replace`: then what
        was there is deleted."""
    # -- request parts (system prompts, tools lists) ---------------------------------------------


class InboxStore(Protocol):
    """Messages posted to a running conversation, delivered with a later turn."""

    async def post_inbox(
        self, key: ConversationKey, content: str, note: str, max_pending: int
    ) -> InboxMessage | None:
        """Queue a pending message (None if there is no such conversation); InboxFull when
        `max_pending` messages are already waiting."""

    async def inbox(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[InboxMessage]:
        """The conversation's inbox messages after id `after`, oldest first, with their status."""

    async def deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        """In one atomic step, deliver with item `seq` every message not yet delivered for good:
        the pending ones, and those whose item failed or was left pending by a turn that never
        ended. Returns them (oldest first). Called once per turn, by its pipeline (no lock held:
        two turns in flight at once may both carry a message; the one whose item goes live
        delivers it for good)."""

    async def inbox_at(self, key: ConversationKey, seqs: Sequence[int]) -> dict[int, list[InboxMessage]]:
        """The messages delivered with each of `seqs` (oldest first), for the seqs that have any."""

    # -- long-term knowledge ---------------------------------------------------------------------


class KnowledgeStore(Protocol):
    """Versioned knowledge documents per tenant and namespace."""

    async def knowledge(self, tenant: str, namespace: str, version: int | None = None) -> KnowledgeVersion | None:
        """A version of the document (None = the newest); None if there is none."""

    async def knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        """The newest version written at or before `cutoff`, else the first; None if there is none."""

    async def knowledge_versions(
        self, tenant: str, namespace: str, *, before: int | None = None, limit: int = 20
    ) -> list[KnowledgeVersion]:
        """Versions newest first, below version `before` if given, at most `limit`."""

    async def put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        """Write version `base_version + 1`, in one atomic step, if `base_version` is still the
        newest (0: there is none yet); None if another version was written meanwhile."""

    async def knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        """The newest version of each document of `tenant` (None: every tenant's), by namespace."""


class LeaseStore(Protocol):
    """Named leases with expiry: one replica at a time does a job (compaction)."""

    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        """Take the named lease if free (or expired): a token to release it with, else None. Used so
        that one compaction at a time runs per conversation (across replicas, for shared backends)."""

    async def release_lease(self, name: str, token: str) -> None:
        """Release the lease if `token` still holds it."""


class StoreLifecycle(Protocol):
    """The store as a whole: its ref secret, crash recovery, health, shutdown."""

    async def secret(self) -> bytes:
        """A random per-store secret (made on first use): keys the HMAC that makes refs unguessable."""

    async def fail_pending(self) -> int:
        """Mark failed every message still pending (written by a turn that a crash cut short; a
        conversation whose lock is held, by a turn planning or ending elsewhere, is left alone).
        Called at start; returns how many were marked. A turn still upstream on another replica
        holds no lock: its items marked failed here become live again when it ends well."""

    async def health(self) -> StoreHealth:
        """Whether the store can write now (never raises): "ok", or "full", "read_only",
        "unavailable" with a detail. Failed operations raise StoreFull / StoreReadOnly /
        StoreUnavailable (StoreError, OpenAI-shaped 507/503) rather than their backend's error."""

    async def close(self) -> None: ...


class Store(TurnStore, HistoryStore, SummaryStore, AdminStore, InboxStore, KnowledgeStore, LeaseStore, StoreLifecycle, Protocol):
    """What the proxy needs from storage: every role above. Each backend implements it whole and
    passes tests/store/test_contract.py; a caller that needs one role names that role."""
