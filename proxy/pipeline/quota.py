"""Stage 4, quota info: each tool message, when first forwarded, shows the LLM-call quota.

A JSON-object tool output gains a `_quota_info: {used, remaining, limit}` key; any other output a
readable line. The figures are those of the message's first forwarding, so the bytes never change.
"""

from __future__ import annotations

import json

from ..config import Settings
from ..messages import Message
from .base import Item, Turn


class QuotaInfo:
    name = "quota"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        if not turn.ledger.on:
            return items
        truncated = turn.notes.get("truncated", {})  # their marker already carries the figures
        out = []
        for item in items:
            msg = item.message
            if msg.get("role") == "tool" and item.seq is not None and item.seq not in truncated:
                figures = turn.ledger.figures(item.seq)
                assert figures is not None
                item = Item(_with_quota(msg, figures.as_dict(), figures.line()), item.seq)
            out.append(item)
        return out


def _with_quota(msg: Message, info: dict[str, int], line: str) -> Message:
    content = msg.get("content")
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return {**msg, "content": json.dumps({**parsed, "_quota_info": info}, ensure_ascii=False)}
        return {**msg, "content": f"{content}\n\n[{line}]"}
    if isinstance(content, list):
        return {**msg, "content": [*content, {"type": "text", "text": f"\n\n[{line}]"}]}
    return msg


def build(settings: Settings) -> QuotaInfo:
    return QuotaInfo()
