"""The inbox stage: messages a person left for the running agent (`POST .../inbox`) go upstream at
the conversation's next turn, and stay where they went on every later turn.

Where a delivery goes, decided once, at the first upstream call of the turn after the message
was posted: appended to the newest tool result when the prompt ends in tool results (the agent
reads it with what its tool returned, as the seed's inbox plugin does after a tool call), else as
a user item of its own right before the client's newest unit. The store records the delivery
with that item's seq (atomically: no two turns take one message); every later turn whose prompt
holds that item sends the same note in the same place, so the log stays what the client sent
(full-history dedupe never sees a divergence) and the prompt stays byte-stable.

Runs after the other rewrites (truncation, masking, the window, quota), so they act on the
client's item as if no note were there and the note is added last; the note travels with its
item (a window that keeps the item keeps the note, compaction that drops the item drops it).
Its tokens are added to the tokens sent. If the item's turn fails, the store hands the message
to the next turn again.
"""

from __future__ import annotations

import time

from ..config import Settings
from ..store import APPEND, BEFORE, InboxMessage
from ..transcript import Item, Role, unit_start
from .base import Turn


class Inbox:
    name = "inbox"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        conversation = turn.conversation
        if conversation is None or not items:  # nothing stored yet: nobody could post to it
            return items
        if not conversation.inbox_open and not conversation.inbox_anchors:  # the usual turn: no inbox
            return items
        sent = {item.seq for item in items if item.seq is not None}
        anchors = sorted(conversation.inbox_anchors & sent)
        delivered = await turn.store.inbox_at(turn.key, anchors) if anchors else {}
        if conversation.inbox_open:
            place = placement(turn, items)
            if place is not None:
                seq, where = place
                new = await turn.store.deliver_inbox(turn.key, seq, where, conversation.turns + 1, time.time())
                known = {m.id for m in delivered.get(seq, ())}
                delivered.setdefault(seq, []).extend(m for m in new if m.id not in known)
                turn.report.inbox_delivered = [m.id for m in new]
        if not any(delivered.values()):
            return items
        return await with_notes(turn, items, delivered)


def placement(turn: Turn, items: list[Item]) -> tuple[int, str] | None:
    """(seq, APPEND | BEFORE) of the item a delivery goes with this turn, or None when it can't
    go anywhere safe this turn (it then waits for the next)."""
    newest = items[-1]
    if newest.role is Role.TOOL:
        appendable = turn.codec.with_appended_text(newest, "\n").raw is not newest.raw
        if newest.seq is not None and appendable and answers_its_call(items, len(items) - 1):
            return newest.seq, APPEND
        return None  # a stray result the pairing guard drops, or one that can't hold text
    start = unit_start(items, len(items) - 1)
    item = items[start]
    if item.seq is None or item.role is Role.SYSTEM:
        return None
    return item.seq, BEFORE


def answers_its_call(items: list[Item], index: int) -> bool:
    """Whether tool result `items[index]` answers a call of its own unit (else pairing drops it)."""
    result = items[index]
    return any(call.id == result.answers for item in items[unit_start(items, index) : index] for call in item.calls)


def note_text(messages: list[InboxMessage]) -> str:
    return "\n\n".join(m.note for m in sorted(messages, key=lambda m: m.id))


async def with_notes(turn: Turn, items: list[Item], delivered: dict[int, list[InboxMessage]]) -> list[Item]:
    out: list[Item] = []
    added: list[Item] = []  # what the notes put into the prompt, for the tokens sent
    removed: list[Item] = []
    for item in items:
        messages = delivered.get(item.seq) if item.seq is not None else None
        if messages:
            before = [m for m in messages if m.placement == BEFORE]
            appended = [m for m in messages if m.placement == APPEND]
            if before:
                note = turn.codec.user_note(note_text(before))
                out.append(note)
                added.append(note)
            if appended:
                removed.append(item)
                item = turn.codec.with_appended_text(item, "\n\n" + note_text(appended))
                added.append(item)
        out.append(item)
    counts = await turn.counter.count_many_async(
        [i.raw for i in added + removed], turn.model, parts=turn.codec.counted_parts
    )
    if turn.report.tokens_sent is not None:
        turn.report.tokens_sent += sum(counts[: len(added)]) - sum(counts[len(added) :])
    return out


def build(settings: Settings) -> Inbox:
    return Inbox()
