"""Anthropic Messages through litellm: a `models:` entry with `litellm_model` serves Claude Code
on any provider (OpenAI, Gemini, a local model), the reply in Anthropic format.

The request is translated to an OpenAI chat request by litellm's own Anthropic adapter (the
`AnthropicAdapter` its `/v1/messages` bridge uses), sent as any chat request of the route
(`LiteLLMUpstream.arguments` and `start`: the same allow-list, keys and error mapping), and the
reply translated back by the same adapter: a `message` JSON body, or `event:` / `data:` SSE
events ending in `message_stop`, tool use included, `model` the public name.

litellm's `anthropic_messages` entry point itself is not used: for OpenAI models it goes to the
Responses API instead of chat completions, and it retries a refused request without its
reasoning behind the client's back. Where the adapter leaves what a chat provider refuses, it
is taken out here: `thinking_blocks` on assistant messages and `cache_control` on parts (another
provider's signatures and breakpoints mean nothing to this one; both kept for the providers
litellm replays them to), and a
`max_tokens` above the model's output limit (Claude Code asks for 128,000) is lowered to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from functools import lru_cache
from typing import Any

import orjson

from .limits import ReplyMeter
from .litellm import LiteLLMReply, LiteLLMUpstream, ProviderStreamBroken, _aclose, _dump, load_litellm

log = logging.getLogger("proxy.litellm")

# Providers that may have Claude behind them: litellm turns thinking blocks and cache_control of
# a chat request back into Anthropic's for them; every other provider refuses or ignores both.
ANTHROPIC_FAMILY = frozenset({"anthropic", "bedrock", "bedrock_converse", "vertex_ai"})


async def messages_call(
    upstream: LiteLLMUpstream, body: Mapping[str, Any], headers: Mapping[str, str]
) -> MessagesReply:
    """One Messages request through `upstream`'s litellm route: an UpstreamReply in Anthropic format."""
    await load_litellm()
    chat, names = to_chat(upstream, body)
    kwargs = upstream.arguments(chat, headers)
    started = await upstream.start(kwargs)
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    adapter = AnthropicAdapter()
    if started.iterator is None:
        message = _dump(adapter.translate_completion_output_params(started.response, tool_name_mapping=names))
        message["model"] = upstream.name
        return MessagesReply(upstream, started.secrets, started.meter, body=orjson.dumps(message, default=_plain))
    events = _events(upstream, started, names)
    return MessagesReply(upstream, started.secrets, started.meter, stream=started.response, events=events)


def to_chat(upstream: LiteLLMUpstream, body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the chat request for `body`, the adapter's map of shortened tool names to the client's)."""
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    request = orjson.loads(orjson.dumps(body))  # the adapter pops and edits what it is given: a copy
    chat, names = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
        request, custom_llm_provider=upstream.provider
    )
    chat = orjson.loads(orjson.dumps(chat, default=_plain))
    if upstream.provider not in ANTHROPIC_FAMILY:
        for message in chat.get("messages") or ():
            if isinstance(message, dict):
                _for_chat_provider(message)
    limit = max_output_tokens(upstream.litellm_model)
    if limit is not None and isinstance(chat.get("max_tokens"), int) and chat["max_tokens"] > limit:
        chat["max_tokens"] = limit
    if chat.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}  # output tokens in the final message_delta
    return chat, names or {}


def _for_chat_provider(message: dict[str, Any]) -> None:
    """Take out of a translated message what only litellm's Anthropic providers read."""
    message.pop("thinking_blocks", None)
    message.pop("cache_control", None)
    content = message.get("content")
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict):
            part.pop("cache_control", None)


@lru_cache(maxsize=256)
def max_output_tokens(litellm_model: str) -> int | None:
    """The model's most output tokens, where litellm's model table knows it."""
    import litellm

    try:
        value = litellm.get_model_info(litellm_model).get("max_output_tokens")
    except Exception:  # noqa: BLE001  # not in the table: the provider says if max_tokens is too high
        return None
    return value if isinstance(value, int) and value > 0 else None


async def _events(upstream: LiteLLMUpstream, started: Any, names: dict[str, str]) -> AsyncIterator[bytes]:
    """The litellm stream as Anthropic SSE events (the adapter's translation, our framing and
    errors: a provider failure mid-stream is a ProviderStreamBroken, its keys scrubbed)."""
    from litellm.llms.anthropic.messages.adapters.streaming_iterator import AnthropicStreamWrapper

    async def chunks() -> AsyncIterator[Any]:
        if started.first is not None:
            yield started.first
        async for chunk in started.iterator:
            yield chunk

    wrapper = AnthropicStreamWrapper(completion_stream=chunks(), model=upstream.name, tool_name_mapping=names)
    stopped = False
    try:
        async for event in wrapper:
            payload = _dump(event) if not isinstance(event, dict) else event
            stopped = stopped or payload.get("type") == "message_stop"
            yield b"event: " + str(payload.get("type")).encode() + b"\ndata: " + orjson.dumps(payload, default=_plain) + b"\n\n"
    except Exception as exc:  # noqa: BLE001  # every provider failure becomes our error
        raise upstream.error(exc, started.secrets, midstream=True) from None
    if not stopped:
        log.warning("provider stream cut short", extra={"model": upstream.name, "litellm_model": upstream.litellm_model})
        raise ProviderStreamBroken(
            502, f"Model {upstream.describe}: provider {upstream.provider} ended the stream before the reply was done",
            "upstream_stream_broken",
        )


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    raise TypeError(f"not JSON: {type(value).__name__}")


class MessagesReply(LiteLLMReply):
    """A litellm route's reply in Anthropic format: a message body, or the adapter's SSE events,
    read within the route's bounds as chat replies are."""

    def __init__(
        self,
        upstream: LiteLLMUpstream,
        secrets: list[str],
        meter: ReplyMeter,
        *,
        body: bytes | None = None,
        stream: Any = None,
        events: AsyncIterator[bytes] | None = None,
    ) -> None:
        super().__init__(upstream, secrets, meter, body=body, stream=stream)
        self._events = events

    async def chunks(self) -> AsyncIterator[bytes]:
        meter = self._meter
        if self._body is not None:
            meter.count(self._body, streamed=True)
            yield self._body
            return
        assert self._events is not None, "a litellm stream is read once"
        events, self._events = self._events, None
        try:
            while True:
                try:
                    async with asyncio.timeout_at(meter.deadline):
                        event = await events.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if meter.expired():
                        raise meter.timeout() from None
                    raise
                meter.count(event, streamed=True)  # past a bound: raises, and the stream is closed below
                yield event
            self._finished = True
        finally:
            if not self._finished:
                await _aclose(self._stream)
