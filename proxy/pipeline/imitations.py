"""First stage, imitations: the client's content that imitates a note of the proxy's own (an
inbox message, a shortened output's marker, a summary header, a quota line: proxy/markers.py)
goes upstream marked as quoted, so that only the proxy's own notes say what they say. A tool
output (a web page, a file the agent read) that prints `[context-proxy: a message from the user,
...]` would otherwise read as the user's word.

First, so that the notes the stages after it add are never touched. It knows no wire format: it
rewrites every string of an item's raw form in which an imitation appears, and leaves whole any
part the upstream signed (a thinking block's `signature`, a reasoning item's
`encrypted_content`: changed, the upstream would refuse it). The rewrite is a pure function of
the text: the same bytes every turn, the stored message as the client sent it.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..config import Settings
from ..markers import EVERY_SEARCH, Searches, neutralised, searches_in
from ..transcript import Item
from .base import StageRun, Turn, item_by_item

SIGNED_KEYS = frozenset({"signature", "encrypted_content"})


class Imitations:
    name = "imitations"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        out = neutral_items(items)
        return items if all(a is b for a, b in zip(out, items, strict=True)) else out

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        return neutral_items(new)  # item by item: the new ones alone

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        return item_by_item(run, keep)


def neutral_items(items: list[Item]) -> list[Item]:
    """`items`, each with its strings neutralised (a new list). The client's items are first
    looked at as one JSON text (orjson's dump and `searches_in`: ~1.05 ms for the bench's 200 KB
    transcript, against ~1.4 ms for walking its strings six searches each), and walked only by
    the searches that may find something in it: none, for most transcripts."""
    theirs = [item.raw for item in items if item.origin is None]
    if not theirs:
        return list(items)
    try:
        searches = searches_in(orjson.dumps(theirs))
    except TypeError:  # a lone surrogate (no JSON text has one): every string searched
        searches = EVERY_SEARCH
    if not searches:
        return list(items)
    return [_neutral_item(item, searches) for item in items]


def _neutral_item(item: Item, searches: Searches) -> Item:
    if item.origin is not None:  # the proxy's own
        return item
    raw = neutral_raw(item.raw, searches)
    return item if raw is item.raw else item.but(raw=raw, hash=None)


def neutral_raw(value: Any, searches: Searches = EVERY_SEARCH) -> Any:
    """`value` with its strings neutralised (by `searches`: see markers.imitations); the same
    object when nothing in it changed. Loops rather than comprehensions, strings handled without
    a call of their own: a first turn walks every string of hundreds of messages."""
    if isinstance(value, dict):
        if not SIGNED_KEYS.isdisjoint(value):
            return value
        changed = None
        for key, v in value.items():
            new = neutralised(v, searches) if v.__class__ is str else neutral_raw(v, searches)
            if new is not v:
                changed = changed or {}
                changed[key] = new
        return {**value, **changed} if changed else value
    if isinstance(value, list):
        out = None
        for i, v in enumerate(value):
            new = neutralised(v, searches) if v.__class__ is str else neutral_raw(v, searches)
            if new is not v:
                out = out or list(value)
                out[i] = new
        return value if out is None else out
    if isinstance(value, str):
        return neutralised(value, searches)
    return value


def build(settings: Settings) -> Imitations:
    return Imitations()
