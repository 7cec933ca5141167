"""The last request of each recent conversation, kept so that the next one costs only its new messages.

A full-history client resends its whole transcript every turn: a prefix identical to what it sent
last time. Comparing each message with the one at the same position last time (`==` on the
parsed dicts, done in C) tells which ones are unchanged; those need no validation, no canonical
hash and no token counting again: their results are reused. Only the new tail is worked on, so a
turn's cost grows with its new messages, not with the conversation.

Safe by construction: equal messages have equal hashes, so a stale or missing entry only costs
time, never correctness. Bounded by the size of the request bodies held (the least recently used
conversation goes first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .identity import ConversationKey
from .messages import Message

# Parsed messages take about as much memory as their JSON text, a little more.
MAX_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True)
class Snapshot:
    messages: list[Message]
    hashes: list[str]
    size: int  # bytes of the request body they came from


class PrefixCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[ConversationKey, Snapshot] = OrderedDict()
        self._held = 0

    def known_prefix(self, key: ConversationKey, messages: list[Message]) -> list[str]:
        """Hashes of the longest prefix of `messages` equal to the last request's (may be empty)."""
        snapshot = self._entries.get(key)
        if snapshot is None:
            return []
        self._entries.move_to_end(key)
        same = 0
        for sent, before in zip(messages, snapshot.messages, strict=False):
            if sent != before:
                break
            same += 1
        return snapshot.hashes[:same]

    def remember(self, key: ConversationKey, messages: list[Message], hashes: list[str], size: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old.size
        if size > self.max_bytes // 2:  # one huge transcript must not push out everyone else
            return
        self._entries[key] = Snapshot(messages, hashes, size)
        self._held += size
        while self._held > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._held -= evicted.size
