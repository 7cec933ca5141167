"""Message contents for spans (`telemetry.capture_content` only), in the GenAI conventions' shape:
`[{"role", "parts": [{"type": "text", "content"}, {"type": "tool_call", "id", "name",
"arguments"}, {"type": "tool_call_response", "id", "response"}]}]`.

Read through the dialect's codec (role, text, calls, the call a result answers), so it knows no
wire format; what the codec has no text for (reasoning, images) is a part naming its type only.
Long contents are cut part by part, so the JSON stays valid within the attribute limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..transcript import Codec, Item, Raw, Role

ROLES = {Role.SYSTEM: "system", Role.USER: "user", Role.ASSISTANT: "assistant", Role.TOOL: "tool"}
CUT = "…[cut]"
TEXT_FIELDS = {"text": "content", "tool_call": "arguments", "tool_call_response": "response"}


def _message(codec: Codec, item: Item) -> dict[str, Any]:
    text = codec.text(item)
    parts: list[dict[str, Any]] = []
    if item.role is Role.TOOL:
        parts.append({"type": "tool_call_response", "id": item.answers, "response": text or ""})
    elif text:
        parts.append({"type": "text", "content": text})
    for call in item.calls:
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments})
    if not parts:
        parts.append({"type": str(item.raw.get("type") or "other")})
    return {"role": ROLES.get(item.role, "other"), "parts": parts}


def _within(messages: list[dict[str, Any]], limit: int) -> str:
    """JSON of `messages`, each text cut to an equal share of `limit` when the whole is longer."""
    encoded = orjson.dumps(messages).decode()
    if len(encoded) <= limit:
        return encoded
    texts = [(part, field) for m in messages for part in m["parts"] if (field := TEXT_FIELDS.get(part["type"])) in part]
    share = max(limit // max(len(texts), 1) - 64, 16)  # 64: the part's own keys and quotes
    for part, field in texts:
        if isinstance(part[field], str) and len(part[field]) > share:
            part[field] = part[field][:share] + CUT
    return orjson.dumps(messages).decode()


def messages_json(codec: Codec, items: Sequence[Item], limit: int) -> str:
    """The items as the conventions' messages, JSON-encoded (as the conventions allow on spans)."""
    return _within([_message(codec, item) for item in items], limit)


def reply_json(codec: Codec, raws: Sequence[Raw], limit: int) -> str:
    """A stored reply's items as the conventions' output messages."""
    n = len(raws)
    return messages_json(codec, codec.items(raws, [None] * n, [None] * n), limit)


def texts_json(limit: int, *messages: tuple[str, str]) -> str:
    """(role, text) pairs as the conventions' messages (the summarizer's prompt and answer)."""
    return _within([{"role": role, "parts": [{"type": "text", "content": text}]} for role, text in messages], limit)
