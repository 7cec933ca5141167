"""What a pipeline stage sees and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Profile
from ..identity import ConversationKey
from ..messages import Message
from ..store import Store, Summary

if TYPE_CHECKING:
    from ..quota import QuotaLedger
    from ..refs import RefSigner
    from ..summarizer import Summarizer
    from ..tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Item:
    """A message on its way upstream, with its place in the conversation log.

    `seq` is None for what is not stored: in proxy-history mode, the client's current system prompt.
    """

    message: Message
    seq: int | None
    hash: str | None = None  # canonical hash of `message` when known (unchanged by the stages so far)


@dataclass(slots=True)
class Turn:
    """One chat request on its way upstream: read-only context for the stages."""

    key: ConversationKey
    body: dict[str, Any]  # the request as received; stages never edit it
    store: Store
    profile: Profile
    counter: TokenCounter
    refs: RefSigner
    ledger: QuotaLedger
    summarizer: Summarizer
    headers: dict[str, str]  # what goes upstream with the request (the summarizer uses the same credentials)
    summary: Summary | None = None  # the conversation's current compaction summary, if any
    notes: dict[str, Any] = field(default_factory=dict)  # what stages report (tokens, counts), for headers/logs

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "")


class Stage(Protocol):
    name: str

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        """Runs before every upstream call; returns a new list, never edits `items` or their messages."""
