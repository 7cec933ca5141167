"""A conversation's trajectory: the replayable record of everything that happened in it.

Every message ever written, in seq order, with its status (live, superseded, failed, incomplete,
internal, pending, and `compacted` for a live message behind the compaction boundary that no
longer goes upstream); tool outputs with their ref; every summary; every turn record (what went
upstream at each turn); and the conversation record. `GET /v1/conversations/{id}/trajectory`
answers it a page of messages at a time, and `storage.trajectory_dir` keeps it as a file per
conversation (trajectory_files.py builds that one incrementally, with the same rule and shape).

The document is assembled from already-encoded parts, so a caller that keeps the parts of an
unchanged message (the file writer) never encodes it again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .dialects.formats import as_tool_output
from .messages import SYSTEM_ROLES
from .refs import RefSigner
from .store import LIVE, Conversation, Store, StoredMessage

COMPACTED = "compacted"
TASK_PAGE = 16  # live messages read at a time looking for the task (it is almost always in the first few)


def shown_status(status: str, seq: int, role: Any, boundary: int, task_seq: int | None) -> str:
    """A message's status as the trajectory shows it: live messages behind the boundary are
    `compacted`, except system prompts and the pinned task, which are still sent every turn."""
    if status == LIVE and seq <= boundary and role not in SYSTEM_ROLES and seq != task_seq:
        return COMPACTED
    return status


def trajectory_message(
    stored: StoredMessage, conversation: Conversation, task_seq: int | None, refs: RefSigner
) -> dict[str, Any]:
    """One message of the trajectory: the stored message plus seq, created_at, status (and ref)."""
    out = stored.to_api(with_status=False)
    out["status"] = shown_status(stored.status, stored.seq, out.get("role"), conversation.boundary, task_seq)
    if as_tool_output(stored.message) is not None:  # in any wire format
        out["ref"] = refs.make(conversation.key, stored.seq)  # derived, never stored: valid under this store's secret
    return out


def encode(value: Any) -> bytes:
    """Compact JSON. orjson, except for what it refuses (integers beyond 64 bits) but JSON allows."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class TrajectoryDocument:
    """The trajectory, each element already encoded as JSON. `chunks()` is its one shape."""

    data: Sequence[bytes]  # the messages of this page, in seq order
    first_id: int | None
    last_id: int | None
    has_more: bool
    summaries: Sequence[bytes]
    turns: Sequence[bytes]
    conversation: bytes

    def chunks(self) -> list[bytes]:
        """The document as pieces to write out in order (no copy of the parts)."""
        out = [b'{"object":"list","data":[']
        out += _joined(self.data)
        out.append(
            b'],"first_id":' + encode(self.first_id) + b',"last_id":' + encode(self.last_id)
            + b',"has_more":' + encode(self.has_more) + b',"summaries":['
        )
        out += _joined(self.summaries)
        out.append(b'],"turns":[')
        out += _joined(self.turns)
        out += [b'],"conversation":', self.conversation, b"}"]
        return out

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks())


def _joined(parts: Sequence[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for i, part in enumerate(parts):
        if i:
            out.append(b",")
        out.append(part)
    return out


async def build_trajectory(
    store: Store, refs: RefSigner, conversation: Conversation, *, after: int | None = None, limit: int | None = None
) -> TrajectoryDocument:
    """The trajectory read whole from the store: the messages after seq `after` (at most `limit`
    of them, `has_more` saying whether more follow), with every summary and turn record."""
    key = conversation.key
    rows = await store.messages(key, live_only=False, after=after, limit=None if limit is None else limit + 1)
    has_more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    task_seq = await pinned_task_seq(store, conversation)
    return TrajectoryDocument(
        data=[encode(trajectory_message(m, conversation, task_seq, refs)) for m in rows],
        first_id=rows[0].seq if rows else None,
        last_id=rows[-1].seq if rows else None,
        has_more=has_more,
        summaries=[encode(s.to_api()) for s in await store.summaries(key)],
        turns=[encode(r) for r in await store.turn_records(key)],
        conversation=encode(conversation.to_api()),
    )


async def pinned_task_seq(store: Store, conversation: Conversation) -> int | None:
    """The seq of the first live user message (the task compaction pins) when it is behind the
    boundary; None when it is not (it is then simply live)."""
    after = 0
    while conversation.boundary:
        page = await store.messages(conversation.key, live_only=True, after=after, limit=TASK_PAGE)
        for stored in page:
            if stored.seq > conversation.boundary:
                return None
            if stored.message.get("role") == "user":
                return stored.seq
        if len(page) < TASK_PAGE:
            return None
        after = page[-1].seq
    return None


def first_live_user(conversation: Conversation, roles: Sequence[Any]) -> int | None:
    """pinned_task_seq from roles already known (`roles[seq - 1]`), without reading the store."""
    if not conversation.boundary:
        return None
    for seq, _ in conversation.live:
        if seq > conversation.boundary:
            return None
        if roles[seq - 1] == "user":
            return seq
    return None
