"""History modes: from a request and the stored transcript, decide what is new and what goes upstream.

- full history: the request carries the whole transcript. The longest prefix whose canonical
  hashes match the live transcript is already stored; the rest is new. Live messages after that
  prefix were diverged from (an edit, a regenerate) and become superseded once the upstream
  accepts the request.
- proxy history: the request carries its system prompt and only new messages; the stored live
  transcript is put between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from .messages import SYSTEM_ROLES, Message
from .pipeline.base import Item
from .store import Conversation, StoredMessage

T = TypeVar("T", Message, StoredMessage)


@dataclass(slots=True)
class TurnPlan:
    new: list[Message]  # to persist before forwarding
    new_hashes: list[str]
    upstream: list[Message]  # the transcript to send (before the pipeline rewrites it)
    # Stored seqs of `upstream` minus its new tail (which gets seqs when written); None = not stored.
    known_seqs: list[int | None] = field(default_factory=list)
    supersede: list[int] = field(default_factory=list)  # live seqs the client diverged from

    upstream_hashes: list[str] = field(default_factory=list)

    def items(self, new_seqs: list[int]) -> list[Item]:
        """`upstream` with each message's seq and hash, once the new messages have their seqs."""
        seqs = self.known_seqs + list(new_seqs)
        return [Item(m, s, h) for m, s, h in zip(self.upstream, seqs, self.upstream_hashes, strict=True)]


def plan_full_history(messages: list[Message], hashes: list[str], conversation: Conversation | None) -> TurnPlan:
    live = conversation.live if conversation else []
    same = 0
    for (_, stored), sent in zip(live, hashes, strict=False):
        if stored != sent:
            break
        same += 1
    return TurnPlan(
        new=messages[same:],
        new_hashes=hashes[same:],
        upstream=messages,
        known_seqs=[seq for seq, _ in live[:same]],
        supersede=[seq for seq, _ in live[same:]],
        upstream_hashes=hashes,
    )


def split_leading_system(messages: list[T]) -> tuple[list[T], list[T]]:
    """(the leading system/developer messages, the rest); works on messages and stored messages."""
    for i, msg in enumerate(messages):
        role = (msg.message if isinstance(msg, StoredMessage) else msg).get("role")
        if role not in SYSTEM_ROLES:
            return messages[:i], messages[i:]
    return messages, []


def plan_proxy_history(messages: list[Message], hashes: list[str], live: list[StoredMessage]) -> TurnPlan:
    system, new = split_leading_system(messages)
    _, history = split_leading_system(live)
    # On the first turn the system prompt joins the record; later, the client's current system
    # prompt leads the upstream prompt and the stored one stays in the record as it was.
    persist_from = len(system) if live else 0
    return TurnPlan(
        new=messages[persist_from:],
        new_hashes=hashes[persist_from:],
        upstream=system + [m.message for m in history] + new,
        known_seqs=[None] * len(system) + [m.seq for m in history] if live else [],
        upstream_hashes=hashes[: len(system)] + [m.hash for m in history] + hashes[len(system) :],
    )
