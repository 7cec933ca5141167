"""The bench's coding-agent transcript (bench/workload.py) as Claude Code sends it over Anthropic
Messages, and a full-history client over it.

The same messages, converted: the system prompt goes in the top-level `system` (a text block with
a cache breakpoint), tool calls are `tool_use` blocks of their assistant message, each tool
result a `tool_result` block of a user message, and the tools carry an `input_schema`. Like
Claude Code, the client puts a `cache_control` breakpoint on the newest message and moves it on
every turn, so the message that held it last time comes back without it: the proxy compares
messages by meaning and must not take that for a change. As in `workload.Conversation`, the
messages are serialized once and kept as bytes; only the newest is serialized per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from .workload import SYSTEM_PROMPT, TOOL_POOL, TOOLS, Message, base_parts, dumps, own_ids, task_message, tool_pool

BREAKPOINT = {"type": "ephemeral"}
MAX_TOKENS = 4096


def tool_use_id(chat_id: str) -> str:
    return "toolu_" + chat_id.removeprefix("call_")


def anthropic_message(message: Message) -> Message:
    """One chat message of the transcript as Claude Code would have sent it (not the system prompt)."""
    role = message["role"]
    if role == "tool":
        result = {"type": "tool_result", "tool_use_id": tool_use_id(message["tool_call_id"]), "content": message["content"]}
        return {"role": "user", "content": [result]}
    if role == "user":
        return {"role": "user", "content": message["content"]}
    blocks: list[Message] = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": fn["name"], "input": json.loads(fn["arguments"])})
    return {"role": "assistant", "content": blocks}


@cache
def base_messages(kind: str) -> tuple[bytes, ...]:
    """The serialized opening messages after the system prompt and the task (which is per conversation)."""
    return tuple(dumps(anthropic_message(json.loads(part))) for part in base_parts(kind)[2:])


@cache
def _head_parts() -> tuple[bytes, bytes]:
    system = [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": BREAKPOINT}]
    tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
        for t in TOOLS
    ]
    return dumps(system), dumps(tools)


def marked(message: Message) -> Message:
    """`message` with a cache breakpoint on its last block (a string becomes a text block)."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": BREAKPOINT}
    return {**message, "content": blocks}


@dataclass
class MessagesConversation:
    """A full-history Claude Code-like client: each request = the previous one's messages + the
    reply + the results of its tool calls, the breakpoint on the newest message."""

    id: str
    kind: str
    index: int = 0  # its place in its pool: picks the tool outputs, the same ones on every run
    turn: int = 0
    _joined: bytearray = field(default_factory=bytearray)  # every message but the newest
    _newest: Message = field(default_factory=dict)
    _count: int = 0
    _pool_offset: int = 0

    def __post_init__(self) -> None:
        task = anthropic_message(json.loads(task_message(self.id)))
        parts = [dumps(task), *base_messages(self.kind)]
        self._newest = json.loads(own_ids(parts.pop(), self.id))
        self._joined = bytearray(own_ids(b",".join(parts), self.id))
        self._count = len(parts) + 1
        self._pool_offset = (self.index * 17) % TOOL_POOL

    @property
    def messages(self) -> int:
        return self._count

    def body(self, model: str, stream: bool) -> bytes:
        system, tools = _head_parts()
        head = (b'{"stream":' + (b"true" if stream else b"false") + b',"model":' + dumps(model)
                + b',"max_tokens":' + str(MAX_TOKENS).encode() + b',"system":' + system + b',"messages":[')
        newest = dumps(marked(self._newest))
        return head + bytes(self._joined) + (b"," if self._joined else b"") + newest + b'],"tools":' + tools + b"}"

    def advance(self, content: list[Message]) -> None:
        """Append the reply's blocks as the client echoes them, then a user message answering its tool calls."""
        calls = [b for b in content if b.get("type") == "tool_use"]
        pool = tool_pool()
        results: list[Message] = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": pool[(self._pool_offset + self.turn * 7 + i) % TOOL_POOL]}
            for i, b in enumerate(calls)
        ]
        answer: Message = {"role": "user", "content": results or "Go on with the next step."}
        self._joined += (b"," if self._joined else b"") + dumps(self._newest) + b"," + dumps({"role": "assistant", "content": content})
        self._newest = answer
        self._count += 2
        self.turn += 1


def assemble_events(text: str) -> list[Message]:
    """The content blocks of an Anthropic SSE stream, as a streaming SDK rebuilds them."""
    blocks: dict[int, Message] = {}
    inputs: dict[int, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        kind, index = event.get("type"), event.get("index")
        if kind == "content_block_start":
            blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[index]["text"] = blocks[index].get("text", "") + delta["text"]
            elif delta["type"] == "input_json_delta":
                inputs.setdefault(index, []).append(delta["partial_json"])
    for index, parts in inputs.items():
        blocks[index]["input"] = json.loads("".join(parts) or "{}")
    return [blocks[i] for i in sorted(blocks)]
