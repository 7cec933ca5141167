"""The diskcache store's request parts (a conversation's system prompts and tools as sent, once
each): a part of DiskStore, which runs these on its thread.

A row per part (written once) and an index row of their hashes: a turn that sends what is kept
already reads the index and writes nothing (the caller asks only when the parts changed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...identity import ConversationKey
from ..base import RequestPart, now
from .area import DiskArea
from .keys import request_part_key, request_parts_key


class DiskRequestParts(DiskArea):
    # ... and the store's record fields (store.py): parts are kept only for a conversation it holds.
    _fields: Callable[[ConversationKey], dict[str, Any] | None]

    async def add_request_parts(self, key: ConversationKey, parts: Sequence[RequestPart]) -> list[str]:
        if not parts:
            return []
        known = await self._run(self._rows.get, request_parts_key(key))
        if known is not None and all(p.hash in known for p in parts):
            return []
        return await self._write(self._add_request_parts, key, list(parts))

    def _add_request_parts(self, key: ConversationKey, parts: list[RequestPart]) -> list[str]:
        with self._rows.transact():
            if self._fields(key) is None:
                return []
            index = dict(self._rows.get(request_parts_key(key)) or {})
            stamp, added = now(), []
            for part in parts:
                if part.hash not in index:
                    index[part.hash] = len(index) + 1
                    self._rows.set(request_part_key(key, index[part.hash]), replace(part, created_at=stamp).to_record())
                    added.append(part.hash)
            if added:
                self._rows.set(request_parts_key(key), index)
            return added

    async def request_parts(self, key: ConversationKey, *, after: int = 0) -> list[RequestPart]:
        return await self._run(self._request_parts, key, after)

    def _request_parts(self, key: ConversationKey, after: int) -> list[RequestPart]:
        index = self._rows.get(request_parts_key(key)) or {}
        rows = (self._rows.get(request_part_key(key, n)) for n in range(max(after, 0) + 1, len(index) + 1))
        return [RequestPart.from_record(row) for row in rows if row is not None]

    def _delete_request_parts(self, key: ConversationKey) -> None:
        index = self._rows.get(request_parts_key(key)) or {}
        for n in range(1, len(index) + 1):
            self._rows.delete(request_part_key(key, n))
        self._rows.delete(request_parts_key(key))
