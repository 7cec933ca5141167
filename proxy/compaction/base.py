"""The compactor interface: the seed's two operations, made async and per conversation.

A custom compactor is any class with this shape, named by dotted path in
`compaction.compactor_class`; it is built once at start-up as `cls(store, summarizer, counter)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..config import Profile
from ..identity import ConversationKey
from ..quota import QuotaFigures
from ..store import Store, Summary
from ..transcript import Codec

if TYPE_CHECKING:
    from ..summarizer import Summarizer
    from ..tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class CompactionJob:
    """What a compaction needs to know about the request that triggered it."""

    key: ConversationKey
    profile: Profile
    model: str  # the model that writes the summary
    headers: dict[str, str]  # the client's credentials, for the summarizer's call (kept in memory only)
    quota: QuotaFigures | None
    codec: Codec  # how the conversation's stored items are read (its wire format's)
    force: bool = False
    dialect: str = "chat"  # the conversation's wire format (a Messages one's summaries go to the Anthropic API)


class Compactor(Protocol):
    def __init__(self, store: Store, summarizer: Summarizer, counter: TokenCounter) -> None: ...

    async def get_summary(self, key: ConversationKey) -> Summary | None:
        """The current summary, or None if there is none yet."""

    async def compact_if_needed(self, job: CompactionJob) -> Summary | None:
        """Make and store a new summary when the profile's threshold is reached (or `job.force`).
        Returns it, or None when nothing was due. Raises on a summarizer failure."""
