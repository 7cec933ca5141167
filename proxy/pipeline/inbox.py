"""The inbox stage: messages a person left for the running agent (`POST .../inbox`) go upstream at
the conversation's next turn, and stay where they went on every later turn.

Where a delivery goes, decided once, at the first upstream call of the turn after the message
was posted: appended to the newest tool result when the prompt ends in tool results (the agent
reads it with what its tool returned, as the seed's inbox plugin does after a tool call), else as
a user item of its own right before the client's newest unit. The store records the delivery
with that item's seq (atomically: no two turns take one message); every later turn whose prompt
holds that item sends the same note in the same place, so the log stays what the client sent
(full-history dedupe never sees a divergence) and the prompt stays byte-stable.

Runs after truncation and compaction (a shortened or masked output keeps its marker, the note
comes after it) and before the token window, which counts the note like the rest of the
history: a note of its own joins the unit of the item it goes before, so the window keeps or
drops them together, and a summary that leaves the item out leaves the note out. The quota
stage comes after: a tool result with a note is no longer a JSON object, so it gets the quota's
readable line, fixed like any other. If the item's turn fails, the store hands the message to
the next turn again.
"""

from __future__ import annotations

import time
from dataclasses import replace

from ..config import Settings
from ..store import APPEND, BEFORE, INBOX_PENDING, InboxMessage
from ..transcript import Item, Origin, Role, unit_start
from .base import StageRun, Turn, passed_through


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
                if turn.dry_run:  # a count of the prompt: the notes as they would go, nothing delivered
                    waiting = await turn.store.inbox(turn.key)
                    new = [replace(m, seq=seq, placement=where) for m in waiting if m.status == INBOX_PENDING]
                else:
                    new = await turn.store.deliver_inbox(turn.key, seq, where, conversation.turns + 1, time.time())
                known = {m.id for m in delivered.get(seq, ())}
                delivered.setdefault(seq, []).extend(m for m in new if m.id not in known)
                turn.report.inbox_delivered = [m.id for m in new]
        if not any(delivered.values()):
            return items
        return with_notes(turn, items, delivered)


    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        """Nothing to deliver and no delivery going with a new item: the new items as they are."""
        conversation = turn.conversation
        if conversation is None or conversation.inbox_open:
            return None
        if conversation.inbox_anchors and any(item.seq in conversation.inbox_anchors for item in new):
            return None
        return new

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        """Nothing to deliver, and no delivery went with the items taken out: they went through as they were."""
        conversation = turn.conversation
        if conversation is None or conversation.inbox_open:
            return None
        if conversation.inbox_anchors and any(item.seq in conversation.inbox_anchors for item in run.before[keep:]):
            return None
        return passed_through(run, keep)


def placement(turn: Turn, items: list[Item]) -> tuple[int, str] | None:
    """(seq, APPEND | BEFORE) of the item a delivery goes with this turn, or None when it can't
    go anywhere safe this turn (it then waits for the next)."""
    last = len(items) - 1
    while last > 0 and items[last].role is Role.USER and items[last].joins:
        last -= 1  # the rest of its results' message (Anthropic: text after the tool_results)
    newest = items[last]
    if newest.role is Role.TOOL:
        appendable = turn.codec.with_appended_text(newest, "\n").raw is not newest.raw
        if newest.seq is not None and appendable and answers_its_call(items, last):
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


def with_notes(turn: Turn, items: list[Item], delivered: dict[int, list[InboxMessage]]) -> list[Item]:
    out: list[Item] = []
    for item in items:
        messages = delivered.get(item.seq) if item.seq is not None else None
        if messages:
            before = [m for m in messages if m.placement == BEFORE]
            appended = [m for m in messages if m.placement == APPEND]
            if before:  # its own user item: the unit it goes before begins with it now (pinned with a pinned task)
                note = turn.codec.user_note(note_text(before))
                out.append(note.but(origin=Origin.INBOX, joins=item.joins, pinned=item.pinned))
                item = item.but(joins=True)
            if appended:
                item = turn.codec.with_appended_text(item, "\n\n" + note_text(appended))
        out.append(item)
    return out


def build(settings: Settings) -> Inbox:
    return Inbox()
