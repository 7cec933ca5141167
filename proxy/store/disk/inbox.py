"""The diskcache store's inbox (messages for an agent between its turns, delivered with a turn's
item): a part of DiskStore, which runs these on its thread. A message's status is never kept: it
is read off the status of the item it went with (delivering while that item is pending,
delivered once it is live, open again if its turn failed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...identity import ConversationKey
from ..base import FAILED, INBOX_DELIVERED, INBOX_DELIVERING, PENDING, InboxFull, InboxMessage, now
from .area import DiskArea
from .keys import inbox_key
from .records import Record


class DiskInbox(DiskArea):
    # ... and the store's records (store.py): a message's status is its item's.
    _load: Callable[[ConversationKey], Record | None]
    _save: Callable[[ConversationKey, Record], None]
    _status: Callable[[ConversationKey, Record, int], str | None]

    async def post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        return await self._write(self._post_inbox, key, content, note, max_pending)

    def _post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                return None
            fields = record.fields
            if len(fields["inbox_open"]) >= max_pending:
                raise InboxFull(str(key))
            fields["inbox"] += 1
            message = {"id": fields["inbox"], "content": content, "note": note, "created_at": now(),
                       "seq": None, "placement": None, "turn": None, "delivered_at": None}
            self._rows.set(inbox_key(key, message["id"]), message)
            fields["inbox_open"] = [*fields["inbox_open"], message["id"]]
            self._save(key, record)
            return InboxMessage(**message)

    async def inbox(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[InboxMessage]:
        return await self._run(self._inbox, key, after, limit)

    def _inbox(self, key: ConversationKey, after: int, limit: int | None) -> list[InboxMessage]:
        record = self._load(key)
        last = record.fields["inbox"] if record else 0
        end = last if limit is None else min(last, after + limit)
        messages = [self._rows.get(inbox_key(key, i)) for i in range(after + 1, end + 1)]
        return [self._inbox_message(key, record, m) for m in messages if m is not None]

    def _inbox_message(self, key: ConversationKey, record: Record, stored: dict[str, Any]) -> InboxMessage:
        """The stored inbox message with its status, read off the status of the item it went with."""
        message = InboxMessage(**stored)
        if message.seq is None:
            return message
        status = self._status(key, record, message.seq) or FAILED
        if status == FAILED:  # its turn failed: it waits for the next one
            return InboxMessage(message.id, message.content, message.note, message.created_at)
        message.status = INBOX_DELIVERING if status == PENDING else INBOX_DELIVERED
        return message

    async def deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        return await self._write(self._deliver_inbox, key, seq, placement, turn, stamp)

    def _deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                return []
            fields = record.fields
            anchor = self._status(key, record, seq)
            anchor_pending = anchor is None or anchor == PENDING
            taken, still_open = [], []
            for message_id in fields["inbox_open"]:
                message = self._rows.get(inbox_key(key, message_id))
                if message["seq"] is not None:
                    before = self._status(key, record, message["seq"])
                    if before is not None and before not in (FAILED, PENDING):
                        continue  # its item is live (or was, and moved on): delivered for good
                    _drop_anchor(fields["inbox_at"], message["seq"], message_id)
                message.update(seq=seq, placement=placement, turn=turn, delivered_at=stamp)
                self._rows.set(inbox_key(key, message_id), message)
                fields["inbox_at"].setdefault(seq, []).append(message_id)
                taken.append(InboxMessage(**message, status=INBOX_DELIVERING if anchor_pending else INBOX_DELIVERED))
                if anchor_pending:
                    still_open.append(message_id)
            fields["inbox_open"] = still_open
            self._save(key, record)
            return taken

    async def inbox_at(self, key: ConversationKey, seqs: Sequence[int]) -> dict[int, list[InboxMessage]]:
        return await self._run(self._inbox_at, key, list(seqs))

    def _inbox_at(self, key: ConversationKey, seqs: list[int]) -> dict[int, list[InboxMessage]]:
        record = self._load(key)
        if record is None:
            return {}
        anchors = record.fields["inbox_at"]
        out = {}
        for seq in seqs:
            ids = anchors.get(seq)
            if ids:
                out[seq] = [self._inbox_message(key, record, self._rows.get(inbox_key(key, i))) for i in ids]
        return out


def inbox_record(m: InboxMessage) -> dict[str, Any]:
    """An inbox message as stored: its status is read off its item, never kept."""
    return {"id": m.id, "content": m.content, "note": m.note, "created_at": m.created_at,
            "seq": m.seq, "placement": m.placement, "turn": m.turn, "delivered_at": m.delivered_at}


def _drop_anchor(anchors: dict[int, list[int]], seq: int, message_id: int) -> None:
    ids = anchors.get(seq, [])
    if message_id in ids:
        ids.remove(message_id)
    if not ids:
        anchors.pop(seq, None)
