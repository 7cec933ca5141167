"""Stage 4, quota info: each tool result, when first forwarded, shows the LLM-call quota.

A JSON-object tool output gains a `_quota_info: {used, remaining, limit}` key; any other output a
readable line. The figures are those of the item's first forwarding, so the bytes never change.
A shortened or masked output carries them in its marker instead.
"""

from __future__ import annotations

import json

from ..config import Settings
from ..markers import QUOTA_INFO_KEY, quota_note
from ..transcript import Item, Role
from .base import StageRun, Turn, item_by_item


class QuotaInfo:
    name = "quota"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        if not turn.ledger.on:
            return items
        out = []
        tool = Role.TOOL  # looked up once (see transcript.Role)
        for item in items:
            if item.role is tool and item.seq is not None and item.ref is None:
                figures = turn.ledger.figures(item.seq)
                assert figures is not None
                item = _with_quota(turn, item, figures.as_dict(), figures.line())
            out.append(item)
        return out

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        return await self(turn, new)  # item by item

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        return item_by_item(run, keep)  # an item's figures are those of its first forwarding, whatever follows


def _with_quota(turn: Turn, item: Item, info: dict[str, int], line: str) -> Item:
    text = turn.codec.text(item)
    if text is not None:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return turn.codec.with_text(item, json.dumps({**parsed, QUOTA_INFO_KEY: info}, ensure_ascii=False))
    return turn.codec.with_appended_text(item, quota_note(line))


def build(settings: Settings) -> QuotaInfo:
    return QuotaInfo()
