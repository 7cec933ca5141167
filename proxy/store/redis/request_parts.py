"""The Redis store's request parts (a conversation's system prompts and tools as sent, once each):
a part of RedisStore. One hash per conversation, outside its scripts' KEYS: part hash ->
"<n>:<created_at>:<JSON {kind, value}>" (lua/add_request_parts.lua)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...identity import ConversationKey
from ..base import RequestPart, now
from .area import RedisArea
from .calls import dumps, guarded

REQUEST_PARTS = "rparts"  # the conversation's system prompts and tools lists: outside the scripts' KEYS


def request_part_row(n: int, part: RequestPart) -> str:
    """A request part as the rparts hash keeps it (see lua/add_request_parts.lua)."""
    return f"{n}:{part.created_at!r}:{dumps({'kind': part.kind, 'value': part.value})}"


class RedisRequestParts(RedisArea):
    _add_request_parts: Any  # its script, registered by the store

    @guarded
    async def add_request_parts(self, key: ConversationKey, parts: Sequence[RequestPart]) -> list[str]:
        if not parts:
            return []
        args: list[Any] = [repr(now())]
        for part in parts:
            args += [part.hash, dumps({"kind": part.kind, "value": part.value})]
        keys = [self._conv(key, "meta"), self._conv(key, REQUEST_PARTS)]
        return list(await self._add_request_parts(keys=keys, args=args))

    @guarded
    async def request_parts(self, key: ConversationKey, *, after: int = 0) -> list[RequestPart]:
        rows = await self._redis.hgetall(self._conv(key, REQUEST_PARTS))  # few: a version per change
        found = []
        for part_hash, row in rows.items():
            n, stamp, data = row.split(":", 2)
            if int(n) > after:
                record = json.loads(data)
                found.append((int(n), RequestPart(record["kind"], part_hash, record["value"], float(stamp))))
        return [part for _, part in sorted(found, key=lambda pair: pair[0])]
