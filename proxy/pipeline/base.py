"""What a pipeline stage sees and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..identity import ConversationKey
from ..messages import Message
from ..store import Store


@dataclass(slots=True)
class Turn:
    """One chat request on its way upstream: read-only context for the stages."""

    key: ConversationKey
    body: dict[str, Any]  # the request as received; stages never edit it
    store: Store
    notes: dict[str, Any] = field(default_factory=dict)  # what stages report (tokens, counts), for headers/logs


class Stage(Protocol):
    name: str

    async def __call__(self, turn: Turn, messages: list[Message]) -> list[Message]:
        """Runs before every upstream call; returns a new message list, never edits `messages`."""
