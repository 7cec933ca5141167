"""Tools the proxy offers the model and answers itself, so the client only ever sees calls of its
own tools: an ordered list of factories, like the pipeline's stages.

Each factory looks at the prompt a turn is about to send and returns the tool it offers this
turn (an object holding that turn's state), or None. The exchange adds the offered tools to the
upstream request, answers their calls in internal rounds, and keeps their calls from the client.
A client tool of the same name always wins: then the proxy's is not offered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..config import Profile
from ..dialects.base import ToolSpec
from ..transcript import Call, Item
from . import history_search, knowledge, readback
from .base import ToolContext


class ProxyTool(Protocol):
    spec: ToolSpec

    async def answer(self, call: Call, room: int | None) -> str:
        """The result text for `call`; `room` = the most tokens it may take (None: no bound)."""


ToolFactory = Callable[[ToolContext, list[Item]], "ProxyTool | None"]

# In the order they are declared to the model.
TOOLS: list[ToolFactory] = [
    readback.offer,  # the recall tools, together: once anything left the prompt, and from then on
    history_search.offer,
    knowledge.offer_read,  # on every turn with knowledge on
    knowledge.offer_replace,
    knowledge.offer_append,
]


def standing(profile: Profile) -> list[ToolSpec]:
    """The tools offered on every turn of `profile`, whatever its prompt holds: their schemas are
    sent with every call, so they count as fixed prompt tokens."""
    return knowledge.standing(profile)


def offered(turn: ToolContext, items: list[Item], has_tool: Callable[[str], bool]) -> list[ProxyTool]:
    """The proxy's tools for this prompt, never one the client has a tool of that name for."""
    return [tool for factory in TOOLS if (tool := factory(turn, items)) is not None and not has_tool(tool.spec.name)]
