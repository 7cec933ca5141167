"""Responses requests for a `models:` entry with `litellm_model`: translated to a chat completion,
sent through the entry's LiteLLMUpstream (`litellm.acompletion`), and the reply translated back.

What comes back is what the Responses dialect reads from OpenAI: a `response` object whose
`output` holds `reasoning`, `message` and `function_call` items in that order, or `event:`/`data:`
SSE with contiguous `sequence_number`s, each output item's events one after the other, ending in
`response.completed` (`.incomplete` when the model ran out of tokens); `model` is the public name.
Errors are the LiteLLMUpstream's OpenAI-shaped ProviderErrors, with the same statuses.

Why not `litellm.aresponses` (its bridge to chat completions, for providers without a Responses
API): measured against the strict fakes, it is not sound for what the proxy sends. A reasoning
item of another model reaches a chat server as an assistant `reasoning_content` and its tool
calls carry `index`, both refused by the OpenAI API; its stream closes the assistant message
after the function call that follows it, so the order a client records items in is wrong; the
signed thinking it streams is only in `response.completed`, not in the item's `done` event; and
it keeps every tool call of every caller in a process-wide cache to patch later requests with.
The translation here is small, keeps no state, and reuses the chat path's parameter allow-list,
error mapping and first-chunk wait.

The parts: litellm_responses_request.py (the request as a chat completion, `Translation`),
litellm_responses_reply.py (a JSON reply as a `response`), litellm_responses_events.py (a
stream's chunks as Responses events). Server-side state: an unresolved `previous_response_id`,
`conversation`, `prompt` and `background` need a provider that keeps responses; a `models:`
entry keeps none, so they are a 400 (the proxy resolves the ids it stored and never sends them on).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import InvalidRequest
from .litellm_responses_events import EventWriter
from .litellm_responses_reply import response_from_completion
from .litellm_responses_request import Translation

if TYPE_CHECKING:
    from .litellm import LiteLLMReply, LiteLLMUpstream

__all__ = ["EventWriter", "ResponsesReply", "Translation", "call_responses", "response_from_completion"]

# Parameters that need responses kept by the provider: a models: entry has none to offer.
SERVER_STATE = ("previous_response_id", "conversation", "prompt")
JSON_HEADERS = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


async def call_responses(
    upstream: LiteLLMUpstream, body: Mapping[str, Any], headers: Mapping[str, str]
) -> ResponsesReply:
    """One Responses request through `upstream` (a chat completion there), answered in Responses format."""
    refuse_server_state(body)
    translation = Translation.of(body, upstream)
    reply = await upstream.chat(translation.chat_body(body), headers)
    return ResponsesReply(reply, translation)


def refuse_server_state(body: Mapping[str, Any]) -> None:
    """A 400 for what needs responses kept upstream: a models: entry keeps none (the proxy has
    already resolved the `previous_response_id`s it stored, and taken them out)."""
    for name in SERVER_STATE:
        value = body.get(name)
        if value is None:
            continue
        if name == "previous_response_id":
            raise InvalidRequest(
                f"Previous response with id '{value}' not found.", param=name, code="previous_response_not_found"
            )
        raise InvalidRequest(
            f"'{name}' needs responses stored by the provider, which models routed through litellm do not keep; "
            "send the whole input instead.",
            param=name,
            code="unsupported_parameter",
        )
    if body.get("background") is True:
        raise InvalidRequest(
            "'background' is not supported for models routed through litellm.",
            param="background",
            code="unsupported_parameter",
        )


class ResponsesReply:
    """UpstreamReply over a LiteLLMReply: its chat completion as a `response` object, or its chat
    chunks as Responses events."""

    status = 200

    def __init__(self, chat: LiteLLMReply, translation: Translation) -> None:
        self._chat = chat
        self._translation = translation
        self.headers: Mapping[str, str] = SSE_HEADERS if chat.is_event_stream else JSON_HEADERS

    @property
    def is_event_stream(self) -> bool:
        return self._chat.is_event_stream

    async def read(self) -> bytes:
        if self._chat.is_event_stream:
            return b"".join([chunk async for chunk in self.chunks()])
        return orjson.dumps(response_from_completion(orjson.loads(await self._chat.read()), self._translation))

    async def chunks(self) -> AsyncIterator[bytes]:
        """Responses SSE: the start events at once, then the events of each chat chunk as it
        comes; the LiteLLMReply raises ProviderStreamBroken if the provider fails or stops early."""
        if not self._chat.is_event_stream:
            yield await self.read()
            return
        events = EventWriter(self._translation)
        yield events.start()
        async for block in self._chat.chunks():
            for data in _data_lines(block):
                if data == b"[DONE]":
                    yield events.finish()
                    return
                chunk = orjson.loads(data)
                if isinstance(chunk, dict):
                    out = events.feed(chunk)
                    if out:
                        yield out

    def close(self) -> None:
        self._chat.close()


def _data_lines(block: bytes) -> list[bytes]:
    return [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
