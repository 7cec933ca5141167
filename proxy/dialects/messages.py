"""Anthropic Messages (`POST /v1/messages`): Claude Code's wire format.

Items. One item per message, except that a user message's `tool_result` blocks each become a
TOOL item of their own: a user message holding just that block, joining the item before it, so
truncation, quota, the window and the pairing guard work per result as they do on chat `tool`
messages. The message's other blocks (Claude Code's `<system-reminder>` text after its results)
form a USER item that joins the results before it. What is stored is these parts; what goes
upstream is the messages rebuilt (`upstream_body`): a run of parts that joins becomes one user
message again, its blocks in order and byte for byte, `tool_result`s first (where a stage added
one, or dropped some, the message stays one the API accepts). Thinking, redacted_thinking and
tool_use blocks stay inside their assistant message, untouched: signatures stay valid, and the
window drops a thinking + tool_use message with its results as one unit. A `role: "system"`
message inside `messages` (a beta) joins the item before it.

The top-level `system` stays the client's; the proxy's own notes (the knowledge document, the
compaction summary) are appended to it as text blocks after the client's. An inbox message goes
into the newest `tool_result` when the prompt ends in tool results, else as a user message of
its own right before the client's newest. Claude Code re-sends a message as blocks that
was a string, and moves its `cache_control` breakpoint to the newest message each turn: the
canonical hash compares messages by meaning, so neither looks new (and the fast path parses and
rewrites only the messages that came back changed: proxy/prefix.py, proxy/engine/fastpath.py;
its upstream body makes again only the messages they, and the new ones, are in:
`upstream_elements`). Breakpoints stay valid: never more than four in the body (the oldest
messages' go first, e.g. stored messages replayed in proxy-history mode), and a dropped block
takes its own with it.

The dialect is this module; its parts: messages_codec.py (items, hashes by meaning, text),
messages_rebuild.py (the messages sent upstream), messages_breakpoints.py (cache breakpoints),
messages_stream.py (the streamed reply across read-back rounds).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequest, ProxyError
from ..identity import session_conversation_id
from ..messages import MAX_DEPTH, too_deep
from ..transcript import Call, Item, Raw
from .base import (
    ByElements,
    Completion,
    Elements,
    JSONBody,
    NoAnchor,
    ReplyRead,
    ToolSpec,
    has_named_tool,
    token_limit,
    tools_text,
)
from .messages_breakpoints import MAX_CACHE_BREAKPOINTS, limit_breakpoints, message_breakpoints, outside_breakpoints
from .messages_codec import ROLES, MessagesCodec, canonical_content, split_message, system_blocks
from .messages_rebuild import OMITTED_NOTE, messages_of, rebuild_messages
from .messages_stream import MessagesRelay, calls_of, error_body

__all__ = ["MESSAGES", "OMITTED_NOTE", "SESSION_HEADER", "MessagesDialect"]

log = logging.getLogger("proxy.messages")

SESSION_HEADER = "X-Claude-Code-Session-Id"


class MessagesDialect(NoAnchor, JSONBody):
    name = "messages"
    transcript_key = "messages"
    session_header = SESSION_HEADER

    def __init__(self) -> None:
        self.codec = MessagesCodec()
        # The split of the last body asked for: a turn asks for its transcript more than once
        # (handler, identity, engine), and splitting costs per message. Held by identity, so a
        # concurrent request's body can only miss it, never get another body's parts.
        self._last: tuple[dict[str, Any], list[Raw]] | None = None

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        last = self._last
        if last is not None and last[0] is body:
            return last[1]
        if "messages" not in body:
            raise InvalidRequest("messages: Field required", param="messages")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise InvalidRequest("messages: Input should be a valid list", param="messages")
        out = self.transcript_parts(messages)
        self._last = (body, out)
        return out

    @staticmethod
    def transcript_parts(messages: list[Any]) -> list[Raw]:
        """The transcript's items of a `messages` array, message by message: so the parts of an
        array that extends another are the other's and then its new messages' (the body cache,
        proxy/prefix.py, splits only what a request adds)."""
        out: list[Raw] = []
        for message in messages:
            content = message.get("content") if type(message) is dict else None
            if type(content) is list and len(content) > 1 and message.get("role") == "user":
                out.extend(split_message(message))  # it may hold tool_results to part
            else:
                out.append(message)  # the usual message: as it is (split_message's own answer)
        return out

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        for i in range(start, len(raws)):
            _validate_part(raws[i], i)

    def by_elements(self) -> ByElements:
        return self  # a user message's tool_result parts make one element

    def anchor(self, body: dict[str, Any]) -> str | None:
        return None  # a Messages request carries its history

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        named = self.session_hint(headers)
        if named is not None:
            return named
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        if not isinstance(user_id, str) or "session_id" not in user_id:
            return None
        try:
            parsed = orjson.loads(user_id)  # Claude Code: a JSON string holding device, account and session
        except ValueError:
            return None
        return session_conversation_id(parsed.get("session_id")) if isinstance(parsed, dict) else None

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        # By meaning: a run keeps its name when a breakpoint moves or a string becomes blocks.
        system = canonical_content(body.get("system"))
        first_user = next(
            (canonical_content(m.get("content")) for m in raws if isinstance(m, dict) and m.get("role") == "user"),
            None,
        )
        return [system, first_user]

    def reply_reserve(self, body: dict[str, Any]) -> int:
        return token_limit(body.get("max_tokens"))

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        parts = [str(b.get("text") or "") for b in system_blocks(body.get("system")) if isinstance(b, dict)]
        return parts + tools_text(body)

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        return has_named_tool(body, name)

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        return self.upstream_body_elements(body, items, tools)[0]

    def upstream_body_elements(
        self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]
    ) -> tuple[dict[str, Any], Elements | None]:
        """`upstream_body`, and its messages as the fast path reuses them (proxy/engine/fastpath.py):
        None when breakpoints had to be taken off (a later body may have to take off others)."""
        firsts: list[int] = []
        messages, notes = rebuild_messages(items, firsts)
        out = {**body, "messages": messages}
        if notes:
            out["system"] = [*system_blocks(body.get("system")), *notes]
        if tools:
            out["tools"] = [*(body.get("tools") or ()), *(self.tool_definition(t) for t in tools)]
        outside, inside = outside_breakpoints(out), message_breakpoints(messages)
        if outside + inside > MAX_CACHE_BREAKPOINTS:
            limit_breakpoints(out)
            return out, None
        return out, Elements(messages, firsts, inside, MAX_CACHE_BREAKPOINTS - outside)

    def upstream_elements(self, items: Sequence[Item]) -> Elements | None:
        firsts: list[int] = []
        messages, notes = messages_of(items, firsts)
        return None if notes else Elements(messages, firsts, message_breakpoints(messages))

    def breakpoints(self, sendable: Sequence[Any]) -> int:
        return message_breakpoints(sendable)

    def read_reply(self, data: bytes) -> ReplyRead | None:
        try:
            parsed = orjson.loads(data)
            content = parsed["content"]
            if parsed.get("type") != "message" or not isinstance(content, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            log.warning("upstream 2xx reply that is not a message; nothing to persist")
            return None
        usage = parsed.get("usage") if isinstance(parsed.get("usage"), dict) else None
        message = {"role": "assistant", "content": content}
        return ReplyRead(
            [message], list(calls_of(content)), usage, response_id=parsed.get("id"),
            complete=parsed.get("stop_reason") is not None,
        )

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        parsed = orjson.loads(data)
        kept_ids = {call.id for call in keep}
        parsed["content"] = [
            b for b in parsed["content"] if not (isinstance(b, dict) and b.get("type") == "tool_use") or b.get("id") in kept_ids
        ]
        if not kept_ids and parsed.get("stop_reason") == "tool_use":  # only ours were left: the turn ends
            parsed["stop_reason"] = "end_turn"
        content = parsed["content"]
        message = {"role": "assistant", "content": content}
        return orjson.dumps(parsed), ReplyRead([message], list(calls_of(content)), reply.usage, reply.response_id)

    def relay(self, anchor: str | None = None) -> MessagesRelay:
        return MessagesRelay()

    def summary_format(self) -> MessagesDialect:
        return self  # Claude Code's key opens no OpenAI API: its summaries go to the Anthropic API

    def summary_request(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": user}]
        return {"model": model, "max_tokens": max_tokens, "system": system, "messages": messages}

    def summary_reply(self, parsed: Any) -> Completion:
        """Its text blocks; its cache reads and writes are input too."""
        blocks = parsed["content"]
        text = "".join(b.get("text") or "" for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        usage = parsed.get("usage") or {}
        tokens_in = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
        tokens_out = int(usage.get("output_tokens") or 0)
        return Completion(text.strip(), tokens_in, tokens_out, cut=parsed.get("stop_reason") == "max_tokens")

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc)


def _validate_part(raw: Any, i: int) -> None:
    """What storing and forwarding need: objects, known roles, blocks with a type, the ids and
    inputs the engine reads. The upstream checks the rest (and its refusal reaches the client)."""
    where = f"messages (part {i})"
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where}: Input should be an object", param="messages")
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role: Input should be 'user', 'assistant' or 'system'", param="messages")
    content = raw.get("content")
    if not isinstance(content, (str, list)):
        raise InvalidRequest(f"{where}.content: Input should be a valid string or list of content blocks", param="messages")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.content: every block must be an object with a 'type'", param="messages")
        kind = block["type"]
        if kind == "tool_use" and not (
            isinstance(block.get("id"), str) and isinstance(block.get("name"), str) and isinstance(block.get("input"), dict)
        ):
            raise InvalidRequest(f"{where}: a tool_use block needs a string id and name and an object input", param="messages")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequest(f"{where}: a tool_result block needs a string tool_use_id", param="messages")
    if too_deep(raw, MAX_DEPTH - 2):
        raise InvalidRequest(f"{where} is nested too deeply", param="messages", code="invalid_json")


MESSAGES = MessagesDialect()
