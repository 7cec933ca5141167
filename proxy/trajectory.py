"""A conversation's trajectory: the replayable record of everything that happened in it.

Every message ever written, in seq order, with its status (live, superseded, failed, incomplete,
internal, pending, and `compacted` for a live message behind the compaction boundary that no
longer goes upstream); tool outputs with their ref; every summary; every turn record (what went
upstream at each turn); every inbox message (pending, or when, in which turn and with which
message it was delivered); and the conversation record. Which items are system prompts, the task
or tool outputs is the conversation's codec's to say (dialects/formats.py: the format its turn
records name), so every wire format is shown alike; and every system prompt and tools list the
turns sent besides their transcript (`request_parts`, each with the turns that sent it). `GET /v1/conversations/{id}/trajectory`
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

from .dialects.formats import codec_for, format_of
from .refs import RefSigner
from .request_parts import with_turns
from .store import LIVE, Conversation, Store, StoredMessage
from .transcript import Codec, Role

COMPACTED = "compacted"
TASK_PAGE = 16  # live messages read at a time looking for the task (it is almost always in the first few)


def shown_status(status: str, seq: int, role: Role, boundary: int, task_seq: int | None) -> str:
    """A message's status as the trajectory shows it: live messages behind the boundary are
    `compacted`, except system prompts and the pinned task, which are still sent every turn."""
    if status == LIVE and seq <= boundary and role is not Role.SYSTEM and seq != task_seq:
        return COMPACTED
    return status


def roles_of(codec: Codec, stored: Sequence[StoredMessage]) -> list[Role]:
    """What each stored message is (system prompt, user, assistant, tool output, other), as its codec reads it."""
    raws = [m.message for m in stored]
    return [item.role for item in codec.items(raws, [m.seq for m in stored], [None] * len(raws))]


async def conversation_codec(store: Store, conversation: Conversation) -> Codec:
    """The codec of the format the conversation was started in (its first turn record's)."""
    return codec_for(format_of(await store.turn_records(conversation.key, limit=1)))


def trajectory_message(
    stored: StoredMessage, role: Role, conversation: Conversation, task_seq: int | None, refs: RefSigner
) -> dict[str, Any]:
    """One message of the trajectory: the stored message plus seq, created_at, status (and ref)."""
    out = stored.to_api(with_status=False)
    out["status"] = shown_status(stored.status, stored.seq, role, conversation.boundary, task_seq)
    if role is Role.TOOL:
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
    inbox: Sequence[bytes] = ()
    request_parts: Sequence[bytes] = ()  # every system prompt and tools list, with the turns that sent it

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
        out.append(b'],"inbox":[')
        out += _joined(self.inbox)
        out.append(b'],"request_parts":[')
        out += _joined(self.request_parts)
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
    of them, `has_more` saying whether more follow), with every summary, turn record and inbox
    message."""
    key = conversation.key
    turns = await store.turn_records(key)
    codec = codec_for(format_of(turns))
    rows = await store.messages(key, live_only=False, after=after, limit=None if limit is None else limit + 1)
    has_more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    task_seq = await pinned_task_seq(store, conversation, codec)
    shown = zip(rows, roles_of(codec, rows), strict=True)
    return TrajectoryDocument(
        data=[encode(trajectory_message(m, role, conversation, task_seq, refs)) for m, role in shown],
        first_id=rows[0].seq if rows else None,
        last_id=rows[-1].seq if rows else None,
        has_more=has_more,
        summaries=[encode(s.to_api()) for s in await store.summaries(key)],
        turns=[encode(r) for r in turns],
        conversation=encode(conversation.to_api()),
        inbox=await inbox_parts(store, conversation),
        request_parts=[encode(p) for p in with_turns(await store.request_parts(key), turns)],
    )


async def inbox_parts(store: Store, conversation: Conversation) -> list[bytes]:
    """The conversation's inbox messages, encoded (no store read for a conversation that has none)."""
    if not conversation.inbox_open and not conversation.inbox_anchors:
        return []
    return [encode(m.to_api()) for m in await store.inbox(conversation.key)]


async def pinned_task_seq(store: Store, conversation: Conversation, codec: Codec) -> int | None:
    """The seq of the first live user message (the task compaction pins) when it is behind the
    boundary; None when it is not (it is then simply live)."""
    after = 0
    while conversation.boundary:
        page = await store.messages(conversation.key, live_only=True, after=after, limit=TASK_PAGE)
        for stored, role in zip(page, roles_of(codec, page), strict=True):
            if stored.seq > conversation.boundary:
                return None
            if role is Role.USER:
                return stored.seq
        if len(page) < TASK_PAGE:
            return None
        after = page[-1].seq
    return None


def first_live_user(conversation: Conversation, roles: Sequence[Role]) -> int | None:
    """pinned_task_seq from roles already known (`roles[seq - 1]`), without reading the store."""
    if not conversation.boundary:
        return None
    for seq, _ in conversation.live:
        if seq > conversation.boundary:
            return None
        if roles[seq - 1] is Role.USER:
            return seq
    return None
