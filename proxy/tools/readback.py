"""`read_tool_output`: the tool the proxy adds while a forwarded prompt holds a shortened tool
output, and answers itself, so the client only ever sees calls of its own tools.

A reply whose tool calls are all ours is answered and the upstream asked again (an internal
round, stored in the trajectory, never shown to the client). A reply that mixes ours with the
client's goes to the client with ours removed: the client's calls are the agent's real work, and
the model can read again on its next turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..config import TruncationSettings
from ..dialects.base import ToolSpec
from ..identity import ConversationKey
from ..markers import READ_TOOL
from ..refs import RefSigner
from ..store import Store
from ..transcript import Call, Codec, Item
from .base import ToolContext
from .history_search import recall_wanted

READ_TOOL_SPEC = ToolSpec(
    name=READ_TOOL,
    description=(
        "Read part of a tool output that was shortened to save context. Pass the ref named in the "
        "output's marker, the character offset to start at, and how many characters to read."
    ),
    parameters={
        "type": "object",
        "properties": {
            "ref": {"type": "string", "description": "The ref named in the shortened output's marker."},
            "offset": {"type": "integer", "minimum": 0, "description": "First character to read."},
            "length": {"type": "integer", "minimum": 1, "description": "How many characters to read."},
        },
        "required": ["ref"],
    },
)


def split_calls(calls: list[Call], ours: frozenset[str]) -> tuple[list[Call], list[Call]]:
    """(our calls, the client's calls), each in order."""
    return [c for c in calls if c.name in ours], [c for c in calls if c.name not in ours]


def offer(turn: ToolContext, items: list[Item]) -> ReadBack | None:
    """Offered with search_history, the other recall tool (see history_search.py): once the prompt
    holds a shortened (truncated or masked) output or anything left it, and from then on."""
    if not recall_wanted(turn, items):
        return None
    return ReadBack(
        turn.store, turn.refs, turn.key, turn.profile.truncation, turn.codec,
        measure=lambda text: turn.counter.count_texts([text], turn.model),
    )


class ReadBack:
    """Answers `read_tool_output` calls from the conversation's log, for one turn.

    Within a turn a range already shown is not shown again ("already shown above"): a model
    that repeats a read must not grow the prompt with the same text. How much may be shown is
    the caller's to say (`room`, in characters): an answer that would overflow the prompt's
    budget is cut to fit, or refused when nothing fits, with a short note saying so.
    """

    def __init__(
        self,
        store: Store,
        refs: RefSigner,
        key: ConversationKey,
        settings: TruncationSettings,
        codec: Codec,
        measure: Callable[[str], int],
    ) -> None:
        self.store, self.refs, self.key, self.settings, self.codec = store, refs, key, settings, codec
        self.measure = measure  # text -> tokens
        self._shown: dict[str, list[tuple[int, int]]] = {}  # ref -> [start, end) ranges answered this turn
        self.spec = READ_TOOL_SPEC

    async def answer(self, call: Call, room: int | None = None) -> str:
        """The text answering `call`; `room` = the most tokens the answer may take (None: no bound)."""
        try:
            args = json.loads(call.arguments or "{}")
            ref = str(args["ref"])
            offset = max(int(args.get("offset", 0)), 0)
            length = min(max(int(args.get("length", self.settings.read_length)), 1), self.settings.read_length)
        except (ValueError, KeyError, TypeError):
            return f"Error: {READ_TOOL} needs JSON arguments {{\"ref\": str, \"offset\": int, \"length\": int}}."
        seq = self.refs.seq_of(self.key, ref)
        stored = await self.store.message(self.key, seq) if seq is not None else None
        text = None
        if stored is not None:
            text = self.codec.text(self.codec.items([stored.message], [stored.seq], [stored.hash])[0])
        if text is None:
            return f"Error: no stored output has ref {ref!r} in this conversation. Use a ref named in a shortened output's marker."
        end = min(offset + length, len(text))
        if offset >= len(text):
            return f"[{ref}: the output has {len(text)} characters; offset {offset} is past its end]"
        shown = next((stop for start, stop in self._shown.get(ref, ()) if start <= offset < stop), None)
        if shown is not None:  # a repeat: the model has it already, and must not loop on it
            more = "" if shown >= end else f"; to read on, continue with offset={shown}"
            return f"[{ref}: characters {offset}-{min(end, shown)} were already shown above in this turn{more}]"
        cut = ""
        if room is not None and self.measure(text[offset:end]) > room - HEADER_TOKENS:
            end = self._fit(text, offset, end, room - HEADER_TOKENS)
            if end - offset < MIN_SHOWN:
                return (
                    f"[{ref}: reading characters {offset}-{min(offset + length, len(text))} would overflow the "
                    "context window; answer with what you have, or read a much shorter range]"
                )
            cut = " (cut to fit the context window)"
        self._shown.setdefault(ref, []).append((offset, end))
        where = "end of output" if end >= len(text) else f"continue with offset={end}"
        return f"[{ref}: characters {offset}-{end} of {len(text)}{cut}; {where}]\n{text[offset:end]}"

    def _fit(self, text: str, offset: int, end: int, room: int) -> int:
        """The largest end (a few tries, each scaled by the measured overshoot) within `room` tokens
        (`offset` itself when there is no room: then nothing is shown)."""
        for _ in range(4):
            if room <= 0 or end <= offset:
                return offset
            tokens = self.measure(text[offset:end])
            if tokens <= room:
                return end
            end = offset + int((end - offset) * room / tokens * 0.95)
        return offset


MIN_SHOWN = 200  # characters: a read cut shorter than this is not worth a round
HEADER_TOKENS = 60  # the answer's first line (ref, range, where to continue): ~45 tokens, measured
