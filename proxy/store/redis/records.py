"""Conversation records as the Redis store reads them: whole, or a snapshot brought up to date.

A turn reads its conversation's record (`Store.get`) under the conversation's lock; the record's
live transcript and first-forwarded marks grow with every turn. So each RedisStore keeps the
latest snapshot of recently read records, with the record's incarnation and version (see
proxy/store/redis/store.py), and asks Redis only for what changed since: nothing, when no replica
wrote; the seqs a write touched, with their state now, otherwise. A snapshot is never edited in
place (callers keep the ones they were given): an update makes a new Conversation that shares
what did not change.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...identity import ConversationKey
from ..base import Conversation

MARK = "mark:"  # meta fields holding the conversation's marks (Conversation.marks)
# Snapshots kept, and the per-seq entries (live, first-forwarded, rewritten, anchor) they hold in
# all: ~120 bytes each as measured (a live entry with its hash's string, a first-forwarded mark),
# so ~25 MB at most however long conversations get.
MAX_SNAPSHOTS = 1024
MAX_SNAPSHOT_ENTRIES = 200_000
CHANGE_FIELDS = 5  # a change is (seq, live member or '', first-forwarded calls or '', rewritten, anchor)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A conversation record as it was at (incarnation, version)."""

    incarnation: str
    version: int
    conversation: Conversation

    @property
    def entries(self) -> int:
        c = self.conversation
        return len(c.live) + len(c.first_forwarded) + len(c.rewritten) + len(c.inbox_anchors)


class Snapshots:
    """The latest snapshot of recently read records, least recently read dropped first."""

    def __init__(self, max_snapshots: int = MAX_SNAPSHOTS, max_entries: int = MAX_SNAPSHOT_ENTRIES) -> None:
        self._max_snapshots, self._max_entries = max_snapshots, max_entries
        self._kept: OrderedDict[ConversationKey, Snapshot] = OrderedDict()
        self._entries = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: ConversationKey) -> Snapshot | None:
        return self._kept.get(key)

    def keep(self, key: ConversationKey, snapshot: Snapshot) -> None:
        if snapshot.entries > self._max_entries:  # a record past the whole budget is read whole
            self.drop(key)
            return
        current = self._kept.get(key)
        if current is not None:
            if current.incarnation == snapshot.incarnation and current.version > snapshot.version:
                return  # a later read (of a concurrent call) landed first
            self._entries -= current.entries
        self._kept[key] = snapshot
        self._kept.move_to_end(key)
        self._entries += snapshot.entries
        while self._kept and (len(self._kept) > self._max_snapshots or self._entries > self._max_entries):
            _, dropped = self._kept.popitem(last=False)
            self._entries -= dropped.entries

    def touch(self, key: ConversationKey) -> None:
        if key in self._kept:
            self._kept.move_to_end(key)

    def drop(self, key: ConversationKey) -> None:
        dropped = self._kept.pop(key, None)
        if dropped is not None:
            self._entries -= dropped.entries


def whole(
    key: ConversationKey, meta: Sequence[str], live: Sequence[str], fwd: Sequence[str], rw: Sequence[str],
    anchors: Sequence[str],
) -> Conversation:
    """The record from its parts as Redis holds them (meta and fwd as flat field, value lists)."""
    return conversation(
        key, _fields(meta), [(int(seq), h) for seq, h in (m.split(":", 1) for m in live)],
        {int(seq): int(calls) for seq, calls in zip(fwd[0::2], fwd[1::2])},
        frozenset(int(seq) for seq in rw), frozenset(int(seq) for seq in anchors),
    )


def updated(base: Conversation, meta: Sequence[str], changes: Sequence[Any]) -> Conversation:
    """`base` with its meta fields as they are now and the changed seqs' state applied: flat
    (seq, live member or '', first-forwarded calls or '', rewritten 1/0, inbox anchor 1/0)."""
    live, forwarded, rewritten, anchors = base.live, base.first_forwarded, base.rewritten, base.inbox_anchors
    seqs = [int(seq) for seq in changes[0::CHANGE_FIELDS]]
    if seqs:
        changed = set(seqs)
        # Changes are mostly at the end (new items, their statuses): what comes before the first
        # changed seq is kept as it is, the rest rebuilt.
        start = bisect_left(live, (min(seqs),))
        tail = [entry for entry in live[start:] if entry[0] not in changed]
        tail += [(seq, member.split(":", 1)[1]) for seq, member in zip(seqs, changes[1::CHANGE_FIELDS]) if member]
        tail.sort()
        live = live[:start] + tail
        calls = {seq: int(c) if c else None for seq, c in zip(seqs, changes[2::CHANGE_FIELDS])}
        if any(forwarded.get(seq) != c for seq, c in calls.items()):
            forwarded = dict(forwarded)
            for seq, c in calls.items():
                if c is None:
                    forwarded.pop(seq, None)
                else:
                    forwarded[seq] = c
        rewritten = _updated_set(rewritten, seqs, changes[3::CHANGE_FIELDS])
        anchors = _updated_set(anchors, seqs, changes[4::CHANGE_FIELDS])
    return conversation(base.key, _fields(meta), live, forwarded, rewritten, anchors)


def _updated_set(seqs: frozenset[int], changed: list[int], flags: Sequence[Any]) -> frozenset[int]:
    now = {seq for seq, flag in zip(changed, flags) if int(flag)}
    gone = set(changed) - now
    if now <= seqs and not gone & seqs:
        return seqs  # unchanged: shared with the previous snapshot
    return (seqs - gone) | now


def _fields(flat: Sequence[str]) -> dict[str, str]:
    return dict(zip(flat[0::2], flat[1::2]))


def conversation(
    key: ConversationKey, meta: dict[str, str], live: list[tuple[int, str]], first_forwarded: dict[int, int],
    rewritten: frozenset[int], anchors: frozenset[int],
) -> Conversation:
    """The Conversation of a record: its meta hash's fields and its per-seq parts."""
    return Conversation(
        key, float(meta["created_at"]), float(meta["updated_at"]), int(meta["next_seq"]), live,
        int(meta["llm_calls"]), first_forwarded, rewritten,
        int(meta["boundary"]), int(meta["summary_id"]) if "summary_id" in meta else None,
        {name[len(MARK) :]: int(value) for name, value in meta.items() if name.startswith(MARK)},
        title=meta.get("title"), task=meta.get("task"), model=meta.get("model"), client=meta.get("client"),
        failures=int(meta.get("failures", 0)),
        last_error=json.loads(meta["last_error"]) if "last_error" in meta else None,
        turns=int(meta.get("turns", 0)), inbox_open=int(meta.get("inbox_open", 0)),
        inbox_anchors=anchors,
    )
