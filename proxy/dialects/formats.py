"""Every dialect by its name (the `format` of a conversation's turn records), and what the
admin side reads of a stored message whatever its format."""

from __future__ import annotations

from ..transcript import Codec, Item, Raw, Role
from .base import Dialect
from .chat import CHAT
from .messages import MESSAGES
from .responses import RESPONSES

DIALECTS: dict[str, Dialect] = {dialect.name: dialect for dialect in (CHAT, RESPONSES, MESSAGES)}


def as_tool_output(message: Raw, seq: int | None = None) -> tuple[Item, Codec] | None:
    """A stored message as a tool output, whichever wire format it is in (their shapes are
    disjoint: a chat `tool` message, a Responses `function_call_output`, an Anthropic user message
    holding one `tool_result`), with the codec that reads it; None if it is not one."""
    for dialect in DIALECTS.values():
        item = dialect.codec.items([message], [seq], [None])[0]
        if item.role is Role.TOOL:
            return item, dialect.codec
    return None
