"""The knowledge stages (opt-in, `knowledge.enabled`): the tenant's long-term knowledge document
goes upstream as a system message right after the client's own (proxy/knowledge.py is the
document; proxy/tools/knowledge.py the tools that edit it).

As one of the leading system items it is never compacted, and the token window counts it
against the model's context window but not against the history limit; it is in the tokens sent.
It is cut to `knowledge.max_tokens`.

When its text changes, for the prompt cache: it sits near the very start of the prompt, so a
change there makes the provider read everything after it again. So it changes only when what
follows it changes anyway: when the token window cuts (its start moves forward) or a new
compaction summary replaces the history. Between those, every prompt of a conversation carries
the same bytes here, whatever was edited meanwhile (the agent's own edits, another
conversation's, the admin's; knowledge_read always shows the newest). A refresh then costs the
re-reading of this message once, at a moment the rest of the prompt is re-read anyway.

Which version a prompt shows is a function of stored, never-changing data, so every replica sends
the same bytes: the newest version written at or before a moment, else the document's first. The
moment is when the conversation started, until a refresh moves it to when the turn's newest item
was written; the conversation keeps that item's seq as its mark (`knowledge_from`). Two stages:
`Knowledge` (before compaction) puts the document in; `KnowledgeRefresh` (right after the window,
which says whether it cut) moves it to the newest version when it may, if the prompt has room.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..config import Settings
from ..knowledge import current, note
from ..marks import KNOWLEDGE_MARK, WINDOW_MARK
from ..store import KnowledgeVersion
from ..transcript import Item, Origin, leading_system_count
from .base import StageRun, Turn, passed_through

CACHED_NOTES = 256  # entries of each cache: about one per active conversation


class Knowledge:
    name = "knowledge"

    def __init__(self) -> None:
        # Both pure functions of stored data that never changes, so kept (least recently used out):
        # (tenant, id, created_at, mark) -> the moment; (tenant, namespace, moment, budget,
        # tokenizer) -> (version, the message's text).
        self._moments: OrderedDict[tuple[Any, ...], float] = OrderedDict()
        self._notes: OrderedDict[tuple[Any, ...], tuple[int, str]] = OrderedDict()

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        settings = turn.profile.knowledge
        if not settings.enabled:
            return items
        moment = await self._moment(turn)
        key = (*_document(turn), moment, settings.max_tokens, settings.editable, turn.counter.tokenizer_name(turn.model))
        cached = _get(self._notes, key)
        if cached is None:
            version = await _version_at(turn, moment)
            cached = _put(self._notes, key, (version.version, _render(turn, version)))
        turn.report.knowledge = {"namespace": _document(turn)[1] or None, "version": cached[0], "as_of": moment}
        n_system = leading_system_count(items)
        document = turn.codec.system_note(cached[1]).but(origin=Origin.KNOWLEDGE)
        return [*items[:n_system], document, *items[n_system:]]

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        return None if turn.profile.knowledge.enabled else new  # the document: only the whole pipeline

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        return None if turn.profile.knowledge.enabled else passed_through(run, keep)

    async def _moment(self, turn: Turn) -> float:
        mark, conversation = turn.marks.knowledge_from, turn.conversation
        if mark is None or conversation is None:
            return await _moment(turn, None)
        key = (turn.key.tenant, turn.key.id, conversation.created_at, mark)
        found = _get(self._moments, key)
        return found if found is not None else _put(self._moments, key, await _moment(turn, mark))


class KnowledgeRefresh:
    name = "knowledge_refresh"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        shown = turn.report.knowledge
        at = next((i for i, item in enumerate(items) if item.origin is Origin.KNOWLEDGE), None)
        if shown is None or at is None:
            return items
        cut = WINDOW_MARK in turn.report.marks
        summarized = turn.summary is not None and turn.summary.created_at > shown["as_of"]
        newest = next((item.seq for item in reversed(items) if item.seq is not None), None)
        if not (cut or summarized) or newest is None or newest == turn.marks.knowledge_from:
            return items
        moment = await _moment(turn, newest)
        version = await _version_at(turn, moment)
        if version.version == shown["version"]:
            turn.report.marks[KNOWLEDGE_MARK] = newest  # nothing newer: the next summary is what counts
            return items
        document = turn.codec.system_note(_render(turn, version)).but(origin=Origin.KNOWLEDGE)
        old, new = await turn.counter.count_many_async(
            [items[at].raw, document.raw], turn.model, parts=turn.codec.counted_parts
        )
        report = turn.report
        if report.tokens_sent is not None and report.token_budget is not None:
            if new - old > report.token_budget - report.tokens_sent:
                return items  # no room left in this prompt: at the next cut
            report.tokens_sent += new - old
        report.marks[KNOWLEDGE_MARK] = newest
        report.knowledge = {**shown, "version": version.version, "as_of": moment}
        return [*items[:at], document, *items[at + 1 :]]

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        return None if turn.report.knowledge is not None else new

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        return None if turn.report.knowledge is not None else passed_through(run, keep)


def _get(cache: OrderedDict[tuple[Any, ...], Any], key: tuple[Any, ...]) -> Any:
    found = cache.get(key)
    if found is not None:
        cache.move_to_end(key)
    return found


def _put(cache: OrderedDict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> Any:
    cache[key] = value
    if len(cache) > CACHED_NOTES:
        cache.popitem(last=False)
    return value


def _document(turn: Turn) -> tuple[str, str]:
    return turn.key.tenant, turn.knowledge_namespace or ""


async def _moment(turn: Turn, mark: int | None) -> float:
    """When the item `mark` was written; with no mark, when the conversation started."""
    if mark is not None and (stored := await turn.store.message(turn.key, mark)) is not None:
        return stored.created_at
    conversation = turn.conversation or await turn.store.get(turn.key)  # its first turn: just made
    return conversation.created_at if conversation is not None else 0.0


async def _version_at(turn: Turn, moment: float) -> KnowledgeVersion:
    tenant, namespace = _document(turn)
    found = await turn.store.knowledge_at(tenant, namespace, moment)
    return found or await current(turn.store, tenant, namespace, write=not turn.dry_run)


def _render(turn: Turn, version: KnowledgeVersion) -> str:
    settings = turn.profile.knowledge
    return note(version, settings.max_tokens, lambda t: turn.counter.count_texts([t], turn.model), settings.editable)


def build(settings: Settings) -> Knowledge:
    # Always in the list: whether it acts is per request (profiles turn it on).
    return Knowledge()


def build_refresh(settings: Settings) -> KnowledgeRefresh:
    return KnowledgeRefresh()
