"""Every managed wire format by the name a conversation's turn records carry (`"format"`), and
the codec that reads what a conversation of that format stored: the admin API and the trajectory
ask it which stored items are system prompts, the task, tool outputs, instead of guessing from
one format's fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..transcript import Codec
from .base import Dialect
from .chat import CHAT
from .gemini import GEMINI
from .messages import MESSAGES
from .responses import RESPONSES

DIALECTS: dict[str, Dialect] = {dialect.name: dialect for dialect in (CHAT, RESPONSES, MESSAGES, GEMINI)}
DEFAULT_FORMAT = CHAT.name  # what a conversation without a turn record yet is read as


def format_of(turn_records: Sequence[Mapping[str, Any]]) -> str | None:
    """A conversation's format: its first turn's (a conversation keeps the format it started in)."""
    for record in turn_records[:1]:
        name = record.get("format")
        if isinstance(name, str) and name in DIALECTS:
            return name
    return None


def codec_for(name: str | None) -> Codec:
    """The codec of format `name`; the default format's for None or a name this proxy doesn't know."""
    return DIALECTS.get(name or DEFAULT_FORMAT, DIALECTS[DEFAULT_FORMAT]).codec
