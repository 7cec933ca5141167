"""Chat Completions (`POST /v1/chat/completions`): the first dialect.

Items are chat messages; their tool-call units are an assistant message with `tool_calls` and
the `tool` messages right after it. Replies are `chat.completion` JSON or `chat.completion.chunk`
SSE events ending in `data: [DONE]`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequest, ProxyError, error_body
from ..messages import SYSTEM_ROLES, message_calls, message_hash, reply_message, text_of, validate_messages
from ..tokens import counted_parts
from ..transcript import Call, Item, Raw, Role
from .base import Completion, JSONBody, NoAnchor, ReplyRead, ToolSpec, token_limit, tools_text
from .chat_stream import ChatRelay

log = logging.getLogger("proxy.chat")

ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT, "tool": Role.TOOL}
# Models that refuse `max_tokens` and take `max_completion_tokens` instead (OpenAI's reasoning models).
_COMPLETION_TOKENS_MODELS = re.compile(r"(?:^|/)(?:o\d|gpt-5)")


class ChatCodec:
    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        # Called on the whole transcript of a first turn: names looked up once, Item's fields by
        # position (calls, answers, joins; keywords cost a third more).
        out: list[Item] = []
        append = out.append
        tool, assistant, other = Role.TOOL, Role.ASSISTANT, Role.OTHER
        in_unit = False  # the previous item is an assistant's calls or one of their results
        for raw, seq, digest in zip(raws, seqs, hashes, strict=True):
            role = ROLES.get(raw.get("role"), other)  # legacy `function` messages: kept as they are
            if role is tool:
                append(Item(raw, role, seq, digest, (), raw.get("tool_call_id"), in_unit))
                continue
            calls = message_calls(raw) if role is assistant else ()
            append(Item(raw, role, seq, digest, calls))
            in_unit = bool(calls)
        return out

    def hash(self, raw: Raw) -> str:
        return message_hash(raw)

    def text(self, item: Item) -> str | None:
        return text_of(item.raw.get("content"))

    def with_text(self, item: Item, text: str) -> Item:
        return item.but(raw={**item.raw, "content": text}, hash=None)

    def with_appended_text(self, item: Item, text: str) -> Item:
        content = item.raw.get("content")
        if isinstance(content, str):
            return item.but(raw={**item.raw, "content": content + text}, hash=None)
        if isinstance(content, list):
            return item.but(raw={**item.raw, "content": [*content, {"type": "text", "text": text}]}, hash=None)
        return item

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        return counted_parts(raw)

    def system_note(self, text: str) -> Item:
        return Item({"role": "system", "content": text}, Role.SYSTEM)

    def user_note(self, text: str) -> Item:
        return Item({"role": "user", "content": text}, Role.USER)

    def tool_result(self, call: Call, text: str) -> Item:
        return Item({"role": "tool", "tool_call_id": call.id, "content": text}, Role.TOOL, answers=call.id, joins=True)


class ChatDialect(NoAnchor, JSONBody):
    name = "chat"
    transcript_key = "messages"
    items_sent_alone = True  # upstream_body sends each item as it alone says: bodies can be spliced (fastpath.py)

    def __init__(self) -> None:
        self.codec = ChatCodec()

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        if "messages" not in body:
            raise InvalidRequest("'messages' is a required property", param="messages")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise InvalidRequest("'messages' must be an array of message objects", param="messages")
        return messages

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        validate_messages(raws, start=start)

    def anchor(self, body: dict[str, Any]) -> str | None:
        return None  # chat requests carry their history (or X-History: proxy)

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        return None  # chat clients name no session: the header, the path or a derived id

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        # Runs before the messages are validated: skip non-dicts. The leading system prompt only:
        # later system notes don't rename a run. Read up to the first user message, not further.
        system: list[Any] = []
        leading = True
        for m in raws:
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            if leading and role in SYSTEM_ROLES:
                system.append(m.get("content"))
                continue
            leading = False
            if role == "user":
                return [system, m.get("content")]
        return [system, None]

    def reply_reserve(self, body: dict[str, Any]) -> int:
        return max(token_limit(body.get("max_completion_tokens")), token_limit(body.get("max_tokens")))

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        return tools_text(body)

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        tools = body.get("tools")
        if not isinstance(tools, list):
            return False
        return any(isinstance(t, dict) and (t.get("function") or {}).get("name") == name for t in tools)

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
        }

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        out = {**body, "messages": [_sendable(item.raw) for item in items]}
        if tools:
            out["tools"] = [*(body.get("tools") or ()), *(self.tool_definition(t) for t in tools)]
        return out

    def read_reply(self, data: bytes) -> ReplyRead | None:
        try:
            parsed = orjson.loads(data)
            choice = parsed["choices"][0]
            message = reply_message(choice["message"])
        except (ValueError, KeyError, IndexError, TypeError):
            log.warning("upstream 2xx reply without choices[0].message; nothing to persist")
            return None
        usage = parsed.get("usage") if isinstance(parsed.get("usage"), dict) else None
        reply_id = parsed.get("id") if isinstance(parsed.get("id"), str) else None
        return ReplyRead(
            [message], list(message_calls(message)), usage, reply_id, complete=bool(choice.get("finish_reason"))
        )

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        parsed = orjson.loads(data)
        choice = parsed["choices"][0]
        raw_message = choice["message"]
        kept_ids = {call.id for call in keep}
        raw_message["tool_calls"] = [c for c in raw_message.get("tool_calls") or () if c.get("id") in kept_ids]
        if not raw_message["tool_calls"]:  # only ours were left: the model has to answer in words
            del raw_message["tool_calls"]
            if raw_message.get("content") is None:
                raw_message["content"] = ""  # an assistant message needs content or calls
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
        message = reply_message(raw_message)
        return orjson.dumps(parsed), ReplyRead([message], list(message_calls(message)), reply.usage, reply.response_id)

    def relay(self, anchor: str | None = None) -> ChatRelay:
        return ChatRelay()

    def summary_format(self) -> ChatDialect:
        return self

    def summary_request(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        limit = "max_completion_tokens" if _COMPLETION_TOKENS_MODELS.search(model) else "max_tokens"
        return {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            limit: max_tokens,
        }

    def summary_reply(self, parsed: Any) -> Completion:
        choice = parsed["choices"][0]
        content = choice["message"]["content"]
        usage = parsed.get("usage") or {}
        return Completion(
            content.strip() if isinstance(content, str) else "",
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            cut=choice.get("finish_reason") == "length",
        )

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc.message, exc.type, exc.code, exc.param)


def _sendable(raw: Raw) -> Raw:
    """An assistant message with neither content nor calls (a streamed reply whose calls were all
    the proxy's) goes upstream with empty content: the API refuses a null one."""
    if raw.get("role") == "assistant" and raw.get("content") is None and not raw.get("tool_calls"):
        return {**raw, "content": ""}
    return raw


CHAT = ChatDialect()
