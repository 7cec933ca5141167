"""Shared by the Messages tests: a proxy pointed at the strict Anthropic fake, the official
`anthropic` client on it, and the small shapes a client sends back (its answer, tool results)."""

from __future__ import annotations

import json
from typing import Any

import anthropic

from tests.conftest import ALICE, MakeProxy
from tests.fakes.fake_upstream import FakeUpstream
from tests.support.harness import ProxyServer, merge_sections

MODEL = "claude-test-1"
THINKING = {"type": "enabled", "budget_tokens": 1024}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
BUILD = {"name": "run_build", "description": "Run the build", "input_schema": {"type": "object", "properties": {}}}


def messages_proxy(make_proxy: MakeProxy, fake: FakeUpstream, **sections: dict[str, Any]) -> ProxyServer:
    """A proxy whose Anthropic API is the fake's (and whose OpenAI API is the fake's too)."""
    return make_proxy(**merge_sections({"upstream": {"anthropic_base_url": fake.anthropic.base_url}}, sections))


def claude_client(
    proxy: ProxyServer, api_key: str = ALICE, base_url: str | None = None, headers: dict[str, str] | None = None
) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=base_url or proxy.url, api_key=api_key, max_retries=0, default_headers=headers, timeout=120
    )


def as_params(message: anthropic.types.Message) -> dict[str, Any]:
    """An answer passed back as the next request's assistant message, as clients do."""
    return {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}


def results(message: anthropic.types.Message, output: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """The user message answering every tool_use of `message` with `output` (then `extra` blocks)."""
    ids = [block.id for block in message.content if block.type == "tool_use"]
    blocks = [{"type": "tool_result", "tool_use_id": i, "content": output} for i in ids]
    return {"role": "user", "content": [*blocks, *extra]}


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of an Anthropic SSE body."""
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = chunk.split("\n")
        name = next(line[len("event: "):] for line in lines if line.startswith("event: "))
        data = next(line[len("data: "):] for line in lines if line.startswith("data: "))
        events.append((name, json.loads(data)))
    return events


def block_types(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(role, block types or 'string') of each message of a request body."""
    return [
        (m["role"], [b["type"] for b in m["content"]] if isinstance(m["content"], list) else "string")
        for m in body["messages"]
    ]
