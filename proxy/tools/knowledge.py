"""The knowledge tools: how the agent reads and edits its long-term knowledge document (opt-in,
`knowledge.enabled`; the edit tools also need `knowledge.editable`). The proxy offers them on
every turn knowledge is on, answers their calls itself in internal rounds, and keeps them from
the client, as it does read_tool_output. Each round is an upstream call: the quota counts it.

Edits go to the newest version (compare-and-set, so two agents' edits never overwrite each
other) and are refused when the document would no longer fit `knowledge.max_tokens` in the
prompt; each one is a new version, kept, with the conversation that wrote it as its source.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..config import KnowledgeSettings, Profile
from ..dialects.base import ToolSpec
from ..knowledge import EditRefused, append_section, current, edit, fit, fits, replace_section
from ..markers import KNOWLEDGE_APPEND_TOOL, KNOWLEDGE_READ_TOOL, KNOWLEDGE_REPLACE_TOOL
from ..store import Store
from ..transcript import Call
from .base import ToolContext

READ_SPEC = ToolSpec(
    name=KNOWLEDGE_READ_TOOL,
    description=(
        "Read your long-term knowledge notes as they are now (the system message may show an older "
        "version: it is brought up to date only now and then). Pass offset to read on from a character position."
    ),
    parameters={
        "type": "object",
        "properties": {"offset": {"type": "integer", "minimum": 0, "description": "First character to read."}},
    },
)
SECTION_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "heading": {"type": "string", "description": "The section's heading text, without the #s."},
        "content": {"type": "string", "description": "The section's markdown, without its heading."},
    },
    "required": ["heading", "content"],
}
REPLACE_SPEC = ToolSpec(
    name=KNOWLEDGE_REPLACE_TOOL,
    description=(
        "Replace the content of a section of your long-term knowledge notes (kept across "
        "conversations) with new markdown; empty content removes the section."
    ),
    parameters=SECTION_PARAMETERS,
)
APPEND_SPEC = ToolSpec(
    name=KNOWLEDGE_APPEND_TOOL,
    description=(
        "Add a new section at the end of your long-term knowledge notes (kept across conversations): "
        "a fact about the project, a decision and its reason, a pitfall, where something is."
    ),
    parameters=SECTION_PARAMETERS,
)


def standing(profile: Profile) -> list[ToolSpec]:
    """The tools offered on every turn of `profile` (their schemas count as fixed prompt tokens)."""
    settings = profile.knowledge
    if not settings.enabled:
        return []
    return [READ_SPEC, REPLACE_SPEC, APPEND_SPEC] if settings.editable else [READ_SPEC]


def agent_source(conversation_id: str, turn: int) -> str:
    """Who wrote a version the agent wrote: its conversation and the turn (the /ui links to it)."""
    return f"agent:{conversation_id} turn {turn}"


class KnowledgeTool:
    """One knowledge tool for one turn: its calls read or edit the turn's tenant's document."""

    def __init__(self, spec: ToolSpec, turn: ToolContext) -> None:
        self.spec = spec
        self.store: Store = turn.store
        self.tenant, self.namespace = turn.key.tenant, turn.knowledge_namespace or ""
        self.settings: KnowledgeSettings = turn.profile.knowledge
        self.source = agent_source(turn.key.id, (turn.conversation.turns if turn.conversation else 0) + 1)
        self.measure: Callable[[str], int] = lambda text: turn.counter.count_texts([text], turn.model)

    async def answer(self, call: Call, room: int | None) -> str:
        try:
            args = json.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise TypeError
            if self.spec is READ_SPEC:
                return await self._read(max(int(args.get("offset", 0)), 0), room)
            heading, content = args["heading"], args["content"]
            if not isinstance(heading, str) or not isinstance(content, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            fields = '{"offset": int}' if self.spec is READ_SPEC else '{"heading": str, "content": str}'
            return f"Error: {self.spec.name} needs JSON arguments {fields}."
        if self.spec is REPLACE_SPEC:
            return await self._edit(lambda t: replace_section(t, heading, content), f"section {heading!r} replaced")
        return await self._edit(lambda t: append_section(t, heading, content), f"section {heading!r} added")

    async def _read(self, offset: int, room: int | None) -> str:
        version = await current(self.store, self.tenant, self.namespace)
        text = version.text
        head = f"[knowledge notes version {version.version}"
        if offset >= len(text) and text:
            return f"{head}: {len(text)} characters; offset {offset} is past the end]"
        end = len(text) if room is None else fit(text, max(room - HEADER_TOKENS, 0), self.measure, start=offset)
        where = "end of the notes" if end >= len(text) else f"read on with offset={end}"
        return f"{head}, characters {offset}-{end} of {len(text)}; {where}]\n{text[offset:end]}"

    async def _edit(self, change: Callable[[str], str], done: str) -> str:
        def within_budget(text: str) -> str:
            new = change(text)
            # The prompt must hold the notes whole: else the next agent never sees their end.
            if not fits(self.namespace, new, self.settings.max_tokens, self.measure):
                raise EditRefused(
                    f"The notes would take about {self.measure(new)} tokens, over their budget of "
                    f"{self.settings.max_tokens}: shorten them (replace a long section with a shorter one) "
                    "and try again."
                )
            return new

        try:
            _, written = await edit(self.store, self.tenant, self.namespace, within_budget, self.source)
        except EditRefused as refused:
            return f"Not changed: {refused}"
        return f"Done: {done}; the notes are now version {written.version} ({len(written.text)} characters)."


def _offer(spec: ToolSpec) -> Callable[[ToolContext, list], KnowledgeTool | None]:
    def offer(turn: ToolContext, items: list) -> KnowledgeTool | None:
        return KnowledgeTool(spec, turn) if spec in standing(turn.profile) else None

    offer.__name__ = f"offer_{spec.name}"
    return offer


HEADER_TOKENS = 40  # a read's first line (version, range, where to read on)
offer_read = _offer(READ_SPEC)
offer_replace = _offer(REPLACE_SPEC)
offer_append = _offer(APPEND_SPEC)
