"""A chat completion's JSON reply as a Responses `response` object: `reasoning`, `message` and
`function_call` items in that order, usage in Responses' names, `model` the public name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from .litellm_responses_request import Translation, new_id


def response_from_completion(completion: Mapping[str, Any], translation: Translation) -> dict[str, Any]:
    """A chat completion (JSON) as a `response` object."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") if isinstance(message.get("reasoning_content"), str) else ""
    blocks = [thinking_block(b) for b in message.get("thinking_blocks") or () if isinstance(b, dict)]
    if reasoning or blocks:
        output.append(translation.reasoning_item(reasoning, blocks))
    parts = []
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append({"type": "output_text", "text": message["content"], "annotations": []})
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        output.append(
            {"id": new_id("msg"), "type": "message", "status": "completed", "role": "assistant", "content": parts}
        )
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments")
        output.append(
            translation.call_item(
                str(call.get("id") or new_id("call")),
                str(function.get("name") or ""),
                arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
            )
        )
    finish = choice.get("finish_reason")
    status = "incomplete" if finish in ("length", "content_filter") else "completed"
    created = completion.get("created")
    return translation.response(
        new_id("resp"),
        created if isinstance(created, int) else int(time.time()),
        status,
        output,
        response_usage(completion.get("usage")),
        finish,
    )


def thinking_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """A thinking block as it goes back to the provider (a stream's block `index` is ours to drop)."""
    return {k: v for k, v in block.items() if k != "index" and v is not None}


def response_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }
