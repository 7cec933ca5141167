"""`read_tool_output`: the function tool the proxy adds while a forwarded prompt holds a shortened
tool output, and answers itself, so the client only ever sees calls of its own tools.

A reply whose tool calls are all ours is answered and the upstream asked again (an internal
round, stored in the trajectory, never shown to the client). A reply that mixes ours with the
client's goes to the client with ours removed: the client's calls are the agent's real work, and
the model can read again on its next turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .config import TruncationSettings
from .identity import ConversationKey
from .messages import Message, text_of
from .refs import RefSigner
from .store import Store

READ_TOOL = "read_tool_output"
TOOL_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": READ_TOOL,
        "description": (
            "Read part of a tool output that was shortened to save context. Pass the ref named in the "
            "output's marker, the character offset to start at, and how many characters to read."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The ref named in the shortened output's marker."},
                "offset": {"type": "integer", "minimum": 0, "description": "First character to read."},
                "length": {"type": "integer", "minimum": 1, "description": "How many characters to read."},
            },
            "required": ["ref"],
        },
    },
}


def client_has_read_tool(body: dict[str, Any]) -> bool:
    """A client tool of the same name wins: we neither add ours nor intercept its calls."""
    return any((t.get("function") or {}).get("name") == READ_TOOL for t in body.get("tools") or () if isinstance(t, dict))


def with_read_tool(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "tools": [*(body.get("tools") or ()), TOOL_DEFINITION]}


def is_ours(call: dict[str, Any]) -> bool:
    return (call.get("function") or {}).get("name") == READ_TOOL


def split_calls(message: Message) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(our calls, the client's calls) of an assistant message."""
    calls = message.get("tool_calls") or []
    return [c for c in calls if is_ours(c)], [c for c in calls if not is_ours(c)]


class ReadBack:
    """Answers `read_tool_output` calls from the conversation's log."""

    def __init__(self, store: Store, refs: RefSigner, key: ConversationKey, settings: TruncationSettings) -> None:
        self.store, self.refs, self.key, self.settings = store, refs, key, settings

    async def answer(self, call: dict[str, Any]) -> Message:
        return {"role": "tool", "tool_call_id": call.get("id"), "content": await self._read(call)}

    async def _read(self, call: dict[str, Any]) -> str:
        try:
            args = json.loads((call.get("function") or {}).get("arguments") or "{}")
            ref = str(args["ref"])
            offset = max(int(args.get("offset", 0)), 0)
            length = min(max(int(args.get("length", self.settings.read_length)), 1), self.settings.read_length)
        except (ValueError, KeyError, TypeError):
            return f"Error: {READ_TOOL} needs JSON arguments {{\"ref\": str, \"offset\": int, \"length\": int}}."
        seq = self.refs.seq_of(self.key, ref)
        stored = await self.store.message(self.key, seq) if seq is not None else None
        text = text_of(stored.message.get("content")) if stored is not None else None
        if text is None:
            return f"Error: no stored output has ref {ref!r} in this conversation."
        end = min(offset + length, len(text))
        where = "end of output" if end >= len(text) else f"continue with offset={end}"
        return f"[{ref}: characters {offset}-{end} of {len(text)}; {where}]\n{text[offset:end]}"


class CallFilter:
    """Watches a streamed reply's chunks and takes our calls out of what the client sees.

    `feed` returns the payload to forward (the original bytes when nothing of ours is in it), or
    None to forward nothing. Client calls keep their order, renumbered from 0 without ours.
    """

    def __init__(self) -> None:
        self._ours: set[int] = set()
        self._client_index: dict[int, int] = {}
        self.finish_held: bytes | None = None  # the finish chunk, held while only our calls were seen

    @property
    def saw_ours(self) -> bool:
        return bool(self._ours)

    @property
    def saw_client_calls(self) -> bool:
        return bool(self._client_index)

    def feed(self, payload: bytes, chunk: dict[str, Any] | None) -> bytes | None:
        if chunk is None:
            return payload
        choices = chunk.get("choices") or []
        deltas = [c for c in choices if (c.get("delta") or {}).get("tool_calls")]
        finishing = any(c.get("finish_reason") for c in choices)
        if not deltas and not finishing:
            return payload
        changed = False
        for choice in deltas:
            kept = list(self._client_deltas(choice["delta"]["tool_calls"]))
            if kept != choice["delta"]["tool_calls"]:
                changed = True
                if kept:
                    choice["delta"]["tool_calls"] = kept
                else:
                    del choice["delta"]["tool_calls"]
        if finishing and self._ours and not self._client_index:
            self.finish_held = payload
            return None
        if changed:
            if not any(c.get("delta") or c.get("finish_reason") for c in choices):
                return None
            return json.dumps(chunk, ensure_ascii=False).encode()
        return payload

    def _client_deltas(self, deltas: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for delta in deltas:
            index = delta.get("index", 0)
            if index not in self._ours and index not in self._client_index:
                if is_ours(delta):
                    self._ours.add(index)
                else:
                    self._client_index[index] = len(self._client_index)
            if index in self._ours:
                continue
            renumbered = self._client_index[index]
            yield delta if renumbered == index else {**delta, "index": renumbered}
