"""What the store thread keeps in memory of recent conversations, bounded by their entries.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from ...identity import ConversationKey

V = TypeVar("V")

# The per-seq entries (live, first-forwarded, rewritten, batch starts) each kind holds in
# all: ~85 bytes apiece as measured (bench/memory_breakdown.py), so a few MB however long the
# conversations get (1,024 snapshots of 2,000 messages would be ~170 MB).
MAX_HELD_ENTRIES = 64_000


class Held(Generic[V]):
    """What the store keeps in memory of recent conversations (snapshots, records), the least
    recently kept let go first: at most `most` of them, holding `entries` per-seq entries in all
    (a 2,000-message conversation holds a hundred times what a 20-message one does). Written by
    the store's calls, one at a time (on its thread, or in place of it: worker.py); `get` is safe
    from the event loop (one dict look-up)."""

    def __init__(self, most: int, entries: int = MAX_HELD_ENTRIES) -> None:
        self.most, self.entries = most, entries
        self._kept: OrderedDict[ConversationKey, tuple[V, int]] = OrderedDict()
        self.held = 0  # entries of everything kept

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: ConversationKey) -> V | None:
        kept = self._kept.get(key)
        return kept[0] if kept is not None else None

    def put(self, key: ConversationKey, value: V, entries: int) -> None:
        self.pop(key)
        if entries > self.entries:  # past the whole budget: read again when needed
            return
        self._kept[key] = (value, entries)
        self.held += entries
        while len(self._kept) > self.most or self.held > self.entries:
            _, (_, dropped) = self._kept.popitem(last=False)
            self.held -= dropped

    def pop(self, key: ConversationKey) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.held -= kept[1]

    def clear(self) -> None:
        self._kept.clear()
        self.held = 0
