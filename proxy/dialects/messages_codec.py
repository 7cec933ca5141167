"""Anthropic Messages items, for the engine: the codec of the Messages dialect (messages.py).

Items are a client message's stored parts (`split_message`): the message itself, or for a user
message holding `tool_result` blocks, one TOOL part per result and a USER part per run of other
blocks, joining the part before it. Hashes compare by meaning (`canonical`): a string that comes
back as blocks, a moved `cache_control` breakpoint, a null field or `is_error: false` say nothing.
Text is read and replaced block-aware (`MessagesCodec.with_text`): images, thinking and the
client's breakpoint on a text block stay where they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..messages import canonical_digest, text_of
from ..tokens import IMAGE_TOKENS, PER_MESSAGE, PER_TOOL_CALL
from ..transcript import Call, Item, Raw, Role
from .messages_stream import CallCache, calls_of

ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}
REDACTED_THINKING_TOKENS = 100  # an opaque blob: a flat estimate


def is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def split_message(message: Any) -> list[Any]:
    """The stored parts of one client message: the message itself, or for a user message holding
    tool_result blocks, one part per result and one per run of other blocks, in order."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return [message]
    content = message.get("content")
    if not isinstance(content, list) or len(content) < 2 or not any(is_result(b) for b in content):
        return [message]
    parts: list[Raw] = []
    run: list[Any] = []
    for block in content:
        if is_result(block):
            if run:
                parts.append({"role": "user", "content": run})
                run = []
            parts.append({"role": "user", "content": [block]})
        else:
            run.append(block)
    if run:
        parts.append({"role": "user", "content": run})
    # Keys besides role and content (the API has none for user messages) stay on the first part.
    extra = {k: v for k, v in message.items() if k not in ("role", "content")}
    if extra:
        parts[0] = {**extra, **parts[0]}
    return parts


def result_block(raw: Raw) -> dict[str, Any] | None:
    """The tool_result block of a TOOL part, else None."""
    if raw.get("role") != "user":
        return None
    content = raw.get("content")
    if isinstance(content, list) and len(content) == 1 and is_result(content[0]):
        return content[0]
    return None


def is_note(raw: Raw) -> bool:
    """A system note of the proxy's own: the text block it adds to `system`."""
    return "role" not in raw and raw.get("type") == "text"


# -- meaning, not bytes -------------------------------------------------------------------------


def canonical_content(content: Any) -> Any:
    """Content by meaning: a string is one text block; `cache_control` markers, null fields and
    `is_error: false` say nothing."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [canonical_block(block) for block in content]
    return content


def canonical_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    out = {}
    for key, value in block.items():
        if key == "cache_control" or value is None or (key == "is_error" and value is False):
            continue
        if key == "content":
            value = canonical_content(value)
        out[key] = value
    return out


def canonical(raw: Raw) -> Raw:
    return {key: canonical_content(value) if key == "content" else value for key, value in raw.items() if value is not None}


def system_blocks(system: Any) -> list[Any]:
    """The top-level `system` as a list of blocks."""
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system) if isinstance(system, list) else []


# -- text ---------------------------------------------------------------------------------------


def _with_text(content: Any, text: str) -> Any:
    """`content` with its text replaced by `text`; other blocks (images, thinking) stay in place,
    and so does a cache breakpoint on the text (the client's, on the block it marked)."""
    if not isinstance(content, list):
        return text
    texts = [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
    marker = next((b["cache_control"] for b in reversed(texts) if b.get("cache_control") is not None), None)
    new = {"type": "text", "text": text} if marker is None else {"type": "text", "text": text, "cache_control": marker}
    if len(texts) == len(content):
        return text if marker is None else [new]
    out: list[Any] = []
    placed = False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            if not placed:
                out.append(new)
                placed = True
            continue
        out.append(block)
    if not placed:
        out.append(new)
    return out


def _with_appended_text(content: Any, text: str) -> Any:
    if isinstance(content, str):
        return content + text
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    return text


def _add_counted(content: Any, texts: list[str]) -> int:
    """Append what `content` holds as text to `texts`; return the flat tokens of the rest."""
    if isinstance(content, str):
        texts.append(content)
        return 0
    extra = 0
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            texts.append(str(block.get("thinking") or ""))
        elif kind == "tool_use" or kind == "server_tool_use":  # as chat counts a tool call: its id too
            texts.append(str(block.get("id") or ""))
            texts.append(str(block.get("name") or ""))
            texts.append(orjson.dumps(block.get("input")).decode())
            extra += PER_TOOL_CALL
        elif kind == "tool_result":  # and a tool message: the id of the call it answers
            texts.append(str(block.get("tool_use_id") or ""))
            extra += _add_counted(block.get("content"), texts)
        elif kind == "redacted_thinking":
            extra += REDACTED_THINKING_TOKENS
        elif kind in ("image", "document"):
            extra += IMAGE_TOKENS
        else:  # server tool results, search results...: their JSON, as an estimate
            texts.append(orjson.dumps(block).decode())
    return extra


class MessagesCodec:
    def __init__(self) -> None:
        self.calls = CallCache()  # the transcript's tool_use blocks, read again every turn

    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        # Called on the whole transcript every turn: the checks of result_block and is_note, inline.
        out: list[Item] = []
        append = out.append
        after_result = False  # the previous item is a TOOL part: a user part after it continues its message
        system, user, assistant, tool = Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL  # looked up once (see transcript.Role)
        for raw, seq, digest in zip(raws, seqs, hashes, strict=True):
            role = raw.get("role")
            content = raw.get("content")
            if role == "user":
                if type(content) is list and len(content) == 1:
                    block = content[0]
                    if type(block) is dict and block.get("type") == "tool_result":
                        append(Item(raw, tool, seq, digest, answers=str(block.get("tool_use_id")), joins=True))
                        after_result = True
                        continue
                append(Item(raw, user, seq, digest, joins=after_result and type(content) is list))
            elif role == "assistant":
                append(Item(raw, assistant, seq, digest, calls=calls_of(content, self.calls)))
            elif role is None and raw.get("type") == "text":  # a note of the proxy's: it stands alone
                append(Item(raw, system, seq, digest))
            else:  # a system message joins what it stands beside
                append(Item(raw, system if role == "system" else Role.OTHER, seq, digest, joins=bool(out)))
            after_result = False
        return out

    def hash(self, raw: Raw) -> str:
        return canonical_digest(canonical(raw))

    def text(self, item: Item) -> str | None:
        raw = item.raw
        if item.role is Role.TOOL:  # a user message holding just its tool_result (see items)
            return text_of(raw["content"][0].get("content"))
        if is_note(raw):
            return str(raw.get("text") or "")
        return text_of(raw.get("content"))

    def with_text(self, item: Item, text: str) -> Item:
        raw = item.raw
        if is_note(raw):
            return item.but(raw={**raw, "text": text}, hash=None)
        block = result_block(raw)
        if block is not None:
            block = {**block, "content": _with_text(block.get("content"), text)}
            return item.but(raw={**raw, "content": [block]}, hash=None)
        return item.but(raw={**raw, "content": _with_text(raw.get("content"), text)}, hash=None)

    def with_appended_text(self, item: Item, text: str) -> Item:
        raw = item.raw
        if is_note(raw):
            return item.but(raw={**raw, "text": str(raw.get("text") or "") + text}, hash=None)
        block = result_block(raw)
        if block is not None:
            block = {**block, "content": _with_appended_text(block.get("content"), text)}
            return item.but(raw={**raw, "content": [block]}, hash=None)
        return item.but(raw={**raw, "content": _with_appended_text(raw.get("content"), text)}, hash=None)

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        if is_note(raw):
            return (str(raw.get("text") or ""),), 0
        texts = [str(raw.get("role") or "")]
        extra = PER_MESSAGE + _add_counted(raw.get("content"), texts)
        return tuple(texts), extra

    def system_note(self, text: str) -> Item:
        return Item({"type": "text", "text": text}, Role.SYSTEM)

    def user_note(self, text: str) -> Item:
        # A user message of its own: it goes before the client's newest, which the API takes as one
        # user turn with it (the client's own message keeps its bytes and its breakpoint).
        return Item({"role": "user", "content": text}, Role.USER)

    def tool_result(self, call: Call, text: str) -> Item:
        block = {"type": "tool_result", "tool_use_id": call.id, "content": text}
        return Item({"role": "user", "content": [block]}, Role.TOOL, answers=call.id, joins=True)
