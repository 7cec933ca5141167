"""The knowledge stage (opt-in, `knowledge.enabled`): the tenant's long-term knowledge document
goes upstream as a system message right after the client's own (proxy/knowledge.py is the
document; proxy/tools/knowledge.py the tools that edit it).

As one of the leading system items it is never compacted, and the token window counts it
against the model's context window but not against the history limit; it is in the tokens sent.
It is cut to `knowledge.max_tokens`.

When its text changes, for the prompt cache: it sits near the very start of the prompt, so a
change there makes the provider re-read everything after it. So a conversation shows the version
that was newest when it started (the newest written at or before the conversation was created,
else the document's first), and moves to a newer one only when a compaction summary replaces the
history after it: that rewrite already breaks the cached prefix right after this message, so
refreshing then costs only this message's own tokens once. Between summaries every prompt of a
conversation carries the same bytes here, and edits (the agent's own, another conversation's,
the admin's) reach it at its next summary, or in the next conversation; knowledge_read always
shows the newest. The version is chosen by time, not by state kept per conversation: a pure
function of stored, never-changing versions, so every replica sends the same bytes, and the
rendered message is cached per (tenant, namespace, moment, budget, tokenizer).
"""

from __future__ import annotations

from collections import OrderedDict

from ..config import Settings
from ..knowledge import cutoff, current, note
from ..transcript import Item, leading_system_count
from .base import Turn

CACHED_NOTES = 256  # rendered messages kept: one per active (tenant, namespace, conversation start)


class Knowledge:
    name = "knowledge"

    def __init__(self) -> None:
        self._notes: OrderedDict[tuple[str, str, float, int, str], tuple[int, str]] = OrderedDict()

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        settings = turn.profile.knowledge
        if not settings.enabled:
            return items
        tenant, namespace = turn.key.tenant, turn.knowledge_namespace or ""
        conversation = turn.conversation or await turn.store.get(turn.key)  # its first turn: just created
        moment = cutoff(
            conversation.created_at if conversation else None, turn.summary.created_at if turn.summary else None
        )
        key = (tenant, namespace, moment, settings.max_tokens, turn.counter.tokenizer_name(turn.model))
        cached = self._notes.get(key)
        if cached is None:
            store = turn.store
            version = await store.knowledge_at(tenant, namespace, moment) or await current(store, tenant, namespace)
            text = note(version, settings.max_tokens, lambda t: turn.counter.count_texts([t], turn.model))
            cached = version.version, text
            self._notes[key] = cached
            if len(self._notes) > CACHED_NOTES:
                self._notes.popitem(last=False)
        else:
            self._notes.move_to_end(key)
        turn.report.knowledge = {"namespace": namespace or None, "version": cached[0]}
        n_system = leading_system_count(items)
        return [*items[:n_system], turn.codec.system_note(cached[1]), *items[n_system:]]


def build(settings: Settings) -> Knowledge:
    # Always in the list: whether it acts is per request (profiles turn it on).
    return Knowledge()
