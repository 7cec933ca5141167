"""A compactor named by dotted path in a test config: the plug-in surface, exercised for real."""

from __future__ import annotations

from proxy.compaction import CompactionJob
from proxy.identity import ConversationKey
from proxy.store import Store, Summary


class FixedCompactor:
    def __init__(self, store: Store, summarizer: object, counter: object) -> None:
        self.store = store

    async def get_summary(self, key: ConversationKey) -> Summary | None:
        conversation = await self.store.get(key)
        return await self.store.summary(key, conversation.summary_id) if conversation and conversation.summary_id else None

    async def compact_if_needed(self, job: CompactionJob) -> Summary | None:
        live = await self.store.messages(job.key, live_only=True)
        if len(live) < 2:
            return None
        return await self.store.add_summary(
            job.key, Summary("CUSTOM SUMMARY", live[0].seq, live[-2].seq, "custom", "none", 0, 0)
        )
