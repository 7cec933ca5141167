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

from .messages import SYSTEM_ROLES, Message, message_hash
from .store import Conversation, StoredMessage


@dataclass(slots=True)
class TurnPlan:
    new: list[Message]  # to persist before forwarding
    new_hashes: list[str]
    upstream: list[Message]  # the transcript to send (before the pipeline rewrites it)
    supersede: list[int] = field(default_factory=list)  # live seqs the client diverged from


def plan_full_history(messages: list[Message], conversation: Conversation | None) -> TurnPlan:
    hashes = [message_hash(m) for m in messages]
    live = conversation.live if conversation else []
    same = 0
    for (_, stored), sent in zip(live, hashes):
        if stored != sent:
            break
        same += 1
    return TurnPlan(
        new=messages[same:],
        new_hashes=hashes[same:],
        upstream=messages,
        supersede=[seq for seq, _ in live[same:]],
    )


def split_leading_system(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    for i, msg in enumerate(messages):
        if msg.get("role") not in SYSTEM_ROLES:
            return messages[:i], messages[i:]
    return messages, []


def plan_proxy_history(messages: list[Message], live: list[StoredMessage]) -> TurnPlan:
    system, new = split_leading_system(messages)
    _, history = split_leading_system([m.message for m in live])
    # On the first turn the system prompt joins the record; later, the client's current system
    # prompt leads the upstream prompt and the stored one stays in the record as it was.
    persist = new if live else messages
    return TurnPlan(new=persist, new_hashes=[message_hash(m) for m in persist], upstream=system + history + new)
