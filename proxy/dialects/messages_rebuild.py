"""The Messages request's `messages` rebuilt from the transcript's items (the parts the codec
stored): a run of joined user parts becomes one user message again, its blocks in order and byte
for byte, `tool_result`s first; the proxy's notes are set apart for `system`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..transcript import Item, Raw, Role
from .messages_codec import is_result

# Sent first when the window leaves a prompt starting on an assistant message.
OMITTED_NOTE = "(Earlier messages of this conversation are not shown.)"


def rebuild_messages(items: Sequence[Item], firsts: list[int] | None = None) -> tuple[list[Raw], list[Raw]]:
    """(the messages to send, the proxy's notes for `system`) from the transcript's items; the
    index of the item each message starts at appended to `firsts`, when given.

    A run of joined user parts becomes one user message, its tool_result blocks first (a valid
    client message has them first already: nothing moves then). An assistant message left empty
    (a reply that held only the proxy's calls, past the read-back limit) is not sent: the API
    refuses empty messages. The prompt starts on a user message, as the API wants."""
    messages, notes = messages_of(items, [] if firsts is None else firsts)
    first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), None)
    if first is not None and messages[first].get("role") == "assistant":
        messages.insert(first, {"role": "user", "content": OMITTED_NOTE})
        if firsts is not None:
            firsts.insert(first, firsts[first])
    return messages, notes


def messages_of(items: Sequence[Item], firsts: list[int]) -> tuple[list[Raw], list[Raw]]:
    """`rebuild_messages` but for where the prompt starts: of a run of a prompt's items that
    starts a message, the messages as they go in the whole prompt's (a message starts where
    the item before it ends one, whatever came earlier)."""
    messages: list[Raw] = []
    notes: list[Raw] = []
    merged: list[int] = []  # the messages rebuilt from several parts (our copies): only they can need reordering
    open_user = False  # the last message is a user message being rebuilt from parts
    system, user, assistant, tool = Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL  # looked up once (see transcript.Role)
    for at, item in enumerate(items):
        raw = item.raw
        role = item.role
        if role is system and "role" not in raw:  # a note of the proxy's (is_note)
            notes.append(raw)
            continue
        if role is tool or (role is user and item.joins):
            if not open_user:  # a lone part goes as it is
                messages.append(raw)
                firsts.append(at)
                open_user = True
                continue
            if not merged or merged[-1] != len(messages) - 1:
                messages[-1] = {**messages[-1], "content": list(messages[-1].get("content") or ())}
                merged.append(len(messages) - 1)
            messages[-1]["content"].extend(raw.get("content") or ())
            continue
        open_user = False
        if role is not assistant or raw.get("content"):  # a reply that was only our calls: the API refuses it empty
            messages.append(raw)
            firsts.append(at)
    for k in merged:
        content = messages[k]["content"]
        if _results_not_first(content):
            messages[k]["content"] = [b for b in content if is_result(b)] + [b for b in content if not is_result(b)]
    return messages, notes


def _results_not_first(content: list[Any]) -> bool:
    seen_other = False
    for block in content:
        if not is_result(block):
            seen_other = True
        elif seen_other:
            return True
    return False
