"""The Redis store's inbox (messages for an agent between its turns, delivered with a turn's
item): a part of RedisStore. A message's status is never kept: it is read off the status of the
item it went with (lua/deliver_inbox.lua, lua/inbox.lua)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...identity import ConversationKey
from ..base import FAILED, INBOX_DELIVERED, INBOX_DELIVERING, PENDING, InboxFull, InboxMessage, now
from .area import RedisArea
from .calls import dumps, guarded


class RedisInbox(RedisArea):
    _post_inbox: Any  # its scripts, registered by the store
    _deliver_inbox: Any
    _inbox: Any

    @guarded
    async def post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        stamp = now()
        body = dumps({"content": content, "note": note, "created_at": stamp})
        mid = int(await self._post_inbox(keys=self._keys(key), args=self._args(key, body, max_pending, stamp=stamp)))
        if mid == -1:
            raise InboxFull(str(key))
        return None if mid == 0 else InboxMessage(mid, content, note, stamp)

    @guarded
    async def inbox(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[InboxMessage]:
        last = int(await self._redis.hget(self._conv(key, "meta"), "inbox") or 0)
        end = last if limit is None else min(last, after + limit)
        if end <= after:
            return []
        flat = await self._inbox(keys=self._keys(key), args=self._args(key, "ids", *range(after + 1, end + 1)))
        return [_inbox_message(*flat[i : i + 4]) for i in range(0, len(flat), 4)]

    @guarded
    async def deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        args = self._args(key, seq, placement, turn, stamp=stamp)
        item_status, *flat = await self._deliver_inbox(keys=self._keys(key), args=args)
        return [_inbox_message(*flat[i : i + 3], item_status) for i in range(0, len(flat), 3)]

    @guarded
    async def inbox_at(self, key: ConversationKey, seqs: Sequence[int]) -> dict[int, list[InboxMessage]]:
        if not seqs:
            return {}
        flat = await self._inbox(keys=self._keys(key), args=self._args(key, "seqs", *seqs))
        out: dict[int, list[InboxMessage]] = {}
        for i in range(0, len(flat), 4):
            message = _inbox_message(*flat[i : i + 4])
            if message.seq is not None:
                out.setdefault(message.seq, []).append(message)
        return out


def _inbox_message(mid: str, body: str, delivery: str, item_status: str = "") -> InboxMessage:
    """A stored inbox message with its status, read off the status of the item it went with."""
    record = json.loads(body)
    message = InboxMessage(int(mid), record["content"], record["note"], record["created_at"])
    if not delivery or item_status == FAILED:  # never delivered, or its turn failed: waiting
        return message
    seq, placement, turn, stamp = delivery.split(":", 3)
    message.seq, message.placement, message.turn, message.delivered_at = int(seq), placement, int(turn), float(stamp)
    message.status = INBOX_DELIVERING if item_status in ("", PENDING) else INBOX_DELIVERED
    return message
