"""The store interface every backend implements, and the records it holds.

A conversation is an append-only log of messages. A message's content never changes once
written; only its status does (pending -> live | failed, live -> superseded, ...). The live
transcript is the live messages in sequence order; the trajectory is every message ever written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ProxyError
from ..identity import ConversationKey
from ..messages import Message
from ..titles import title_from_task

# Written before forwarding; becomes live when the upstream accepts the request, failed otherwise.
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
    message: Message
    hash: str
    status: str
    created_at: float

    def to_api(self, *, with_status: bool) -> dict[str, Any]:
        out = {**self.message, "seq": self.seq, "created_at": self.created_at}
        if with_status:
            out["status"] = self.status
        return out


@dataclass(slots=True)
class Summary:
    """A compaction summary: what the live history up to `last_seq` was, for the agent."""

    text: str
    first_seq: int  # the window of live messages it covers (with the previous summary folded in)
    last_seq: int
    strategy: str
    model: str
    tokens_in: int  # what the summarizer spent
    tokens_out: int
    created_at: float = field(default_factory=lambda: now())
    id: int = 0  # set by the store: 1, 2, ... per conversation

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation.summary",
            "text": self.text,
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
    turns: int = 0  # turn records kept
    failures: int = 0  # turns that failed (their record's status is failed)
    last_error: dict[str, Any] | None = None  # the newest failed turn's error, with its `turn`

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
        }


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
        if not all(0 <= seq <= n for seq in c.marks.values()):
            problems.append("marks must be seqs of the conversation")
        if not 0 <= c.failures <= len(self.turns) or (c.failures > 0) != (c.last_error is not None):
            problems.append("failures must count failed turns, with the last one's error")
        if problems:
            raise ValueError(f"conversation {c.key}: " + "; ".join(problems))


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


class Store(Protocol):
    """What the proxy needs from storage. Backends must pass tests/test_store_contract.py."""

    def lock(self, key: ConversationKey) -> AbstractAsyncContextManager[None]:
        """Serialize the turns of one conversation (held for a whole request/reply cycle)."""

    async def get(self, key: ConversationKey) -> Conversation | None: ...

    async def append(self, key: ConversationKey, messages: list[Message], hashes: list[str], status: str) -> list[int]:
        """Append messages (creating the conversation if new); returns their sequence numbers."""

    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        """Change the status of messages by seq, in one atomic step."""

    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Message, str]],
        reply_status: str,
        record: Mapping[str, Any] | None,
    ) -> int | None:
        """End a turn in one atomic step: status changes, then the reply's items (message, hash)
        appended with `reply_status`, then the turn's record (what was sent upstream) kept; a
        record's `response_id` names the reply from then on (`response_owner`), and what it tells
        of the conversation (TurnFacts: model, client, title, task, a failure) is kept on the
        conversation, a failed one also listing it among the failed (`list_conversations(failed=True)`).
        Returns the seq of the reply's first item (None without a reply)."""

    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        """The conversation id and the seq of the last item of the reply a turn record named by
        `response_id` (kept by finish_turn when the record has one); None if unknown."""

    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The records of finished turns, oldest first (each has `turn`, 1, 2, ...), after turn `after`."""

    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        """Messages in sequence order, optionally only those after seq `after`, at most `limit`."""

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

    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None: ...

    async def count_llm_call(self, key: ConversationKey) -> int:
        """Count one upstream call; returns the conversation's total so far, this one included."""

    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        """Record, for messages forwarded for the first time, the call count at that moment."""

    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        """Set named marks on the conversation record (others stay as they are)."""

    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        """Store the forwarded form of messages (by seq), so every later turn sends the same bytes."""

    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]: ...

    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        """Keep a new summary (every one is kept, for audit) and make it current: the boundary moves to
        `summary.last_seq`. Returns it with its id. A summary whose window ends at or before the
        current boundary is kept but does not become current (the boundary never moves back)."""

    async def summaries(self, key: ConversationKey) -> list[Summary]:
        """Every summary of the conversation, oldest first."""

    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None: ...

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        """Write a whole conversation read from another store, under its own key, in one atomic
        step (it lists as the newest; its response ids name it). Raises ValueError for a dump that
        does not `check()`, and ConversationExists when the key is taken, unless `replace`: then what
        was there is deleted."""

    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        """Take the named lease if free (or expired): a token to release it with, else None. Used so
        that one compaction at a time runs per conversation (across replicas, for shared backends)."""

    async def release_lease(self, name: str, token: str) -> None:
        """Release the lease if `token` still holds it."""

    async def secret(self) -> bytes:
        """A random per-store secret (made on first use): keys the HMAC that makes refs unguessable."""

    async def fail_pending(self) -> int:
        """Mark failed every message still pending (written by a turn that a crash cut short; a
        conversation whose lock is held, by a turn still running elsewhere, is left alone).
        Called at start; returns how many were marked."""

    async def health(self) -> StoreHealth:
        """Whether the store can write now (never raises): "ok", or "full", "read_only",
        "unavailable" with a detail. Failed operations raise StoreFull / StoreReadOnly /
        StoreUnavailable (StoreError, OpenAI-shaped 507/503) rather than their backend's error."""

    async def close(self) -> None: ...
