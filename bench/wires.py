"""The client side of each wire format the bench speaks: where it posts, with which headers, which
full-history client makes its bodies, and how a reply (JSON or SSE bytes) joins that client's
transcript. Shared by the load generator (bench/loadgen.py: `make bench`'s phases in any format)
and bench/formats.py (the formats side by side).

    chat       /v1/chat/completions     bench/workload.py            (a coding agent's client)
    messages   /v1/messages?beta=true   bench/messages_workload.py   (Claude Code: its session id, a breakpoint)
    responses  /v1/responses            bench/responses_workload.py  (Codex: every item resent, store off)
    gemini     /v1/models/{model}:...   bench/gemini_workload.py     (Gemini CLI: the model in the URL)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .gemini_workload import GeminiConversation, assemble_chunks
from .messages_workload import MessagesConversation, assemble_events
from .responses_workload import ResponsesConversation, assemble_output
from .workload import Conversation, Message, assemble_stream


class CutShort(ValueError):
    """A reply without the tool call every bench reply carries: a stream cut short."""


@dataclass(frozen=True)
class Wire:
    name: str  # as the bench's tables name it
    path: str  # under the target's base URL (which ends in /v1); {model} and {method}: see `url`
    make: Callable[[str, str, int], Any]  # (conversation id, transcript kind, index in its pool) -> a client
    # (api key, conversation id or None) -> request headers; None: the client names no conversation
    # (the zero-code-change agent, whose conversation the proxy derives from the transcript)
    headers: Callable[[str, str | None], dict[str, str]]
    advance: Callable[[Any, bytes, bool], None]  # the reply's bytes (JSON or SSE) into the client's transcript

    def url(self, base: str, model: str, stream: bool) -> str:
        """Where a request goes: `base` + the path, its model and method filled in where the
        format puts them in the URL (Gemini)."""
        if "{" not in self.path:
            return base + self.path
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return base + self.path.format(model=model, method=method)


def _sse_data(data: bytes) -> list[bytes]:
    return [line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:")]


def _chat_advance(conversation: Conversation, data: bytes, stream: bool) -> None:
    message: Message = assemble_stream(_sse_data(data)) if stream else json.loads(data)["choices"][0]["message"]
    if not message.get("tool_calls"):
        raise CutShort("a chat completion without its tool call")
    conversation.advance(message)


def _responses_advance(conversation: ResponsesConversation, data: bytes, stream: bool) -> None:
    output = assemble_output(data.decode()) if stream else json.loads(data)["output"]
    if not any(item.get("type") == "function_call" for item in output):
        raise CutShort("a response without its function call")
    conversation.advance(output)


def _messages_advance(conversation: MessagesConversation, data: bytes, stream: bool) -> None:
    content = assemble_events(data.decode()) if stream else json.loads(data)["content"]
    if not any(block.get("type") == "tool_use" for block in content):
        raise CutShort("a message without its tool_use")
    conversation.advance(content)


def _named(header: str, conversation_id: str | None) -> dict[str, str]:
    return {} if conversation_id is None else {header: conversation_id}


def _gemini_advance(conversation: GeminiConversation, data: bytes, stream: bool) -> None:
    parts = assemble_chunks(data.decode()) if stream else json.loads(data)["candidates"][0]["content"]["parts"]
    if not any("functionCall" in part for part in parts):
        raise CutShort("a reply without its functionCall")
    conversation.advance(parts)


WIRES = {
    "chat": Wire(
        "chat completions", "/chat/completions",
        lambda cid, kind, i: Conversation(cid, kind, i),
        lambda key, cid: {"Authorization": f"Bearer {key}", **_named("X-Conversation-ID", cid)},
        _chat_advance,
    ),
    "messages": Wire(
        "messages", "/messages?beta=true",
        lambda cid, kind, i: MessagesConversation(cid, kind, i),
        lambda key, cid: {"x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219",
                          **_named("X-Claude-Code-Session-Id", cid)},
        _messages_advance,
    ),
    "responses": Wire(
        "responses", "/responses",
        lambda cid, kind, i: ResponsesConversation(cid, kind, i),
        lambda key, cid: {"Authorization": f"Bearer {key}", **_named("X-Conversation-ID", cid)},
        _responses_advance,
    ),
    "gemini": Wire(
        "gemini", "/models/{model}:{method}",
        lambda cid, kind, i: GeminiConversation(cid, kind, i),
        lambda key, cid: {"x-goog-api-key": key, **_named("X-Conversation-ID", cid)},
        _gemini_advance,
    ),
}
