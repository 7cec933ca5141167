"""The Gemini API through litellm: a `models:` entry with `litellm_model` serves Gemini CLI on any
provider (an OpenAI model, a local one), the reply in Gemini's format.

The request (a GeminiRequest: its model and stream flag from the URL) is translated here to an
OpenAI chat request and sent as any chat request of the route (`LiteLLMUpstream.arguments` and
`start`: the same allow-list, keys and error mapping); the reply comes back as a
GenerateContentResponse, or `data:` SSE chunks of one, function calls included, `modelVersion` the
public name. litellm's own Gemini adapter is not used: it names every call `call_<name>` (two
calls of one tool collide, and a chat provider refuses the repeated id) and drops the ids
Gemini CLI gives its calls.

Calls and responses are paired as the Gemini API pairs them: by id where both have one, else the
k-th response of a user content answers the k-th call of the model content before it (a response
sent twice under one id, as Gemini CLI's `--resume` does, goes once). Thought parts and thought
signatures mean nothing to another provider and are left out; a call the model makes gets the
provider's id, which comes back on its response.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from .base import GeminiRequest
from .litellm import LiteLLMUpstream, ProviderStreamBroken, _dump, load_litellm
from .litellm_messages import MessagesReply

log = logging.getLogger("proxy.litellm")

FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "function_call": "STOP", "content_filter": "SAFETY"}
CALLING_MODES = {"ANY": "required", "NONE": "none", "AUTO": "auto", "VALIDATED": "auto"}


async def gemini_call(upstream: LiteLLMUpstream, body: Mapping[str, Any], headers: Mapping[str, str]) -> MessagesReply:
    """One Gemini request through `upstream`'s litellm route: an UpstreamReply in Gemini format."""
    await load_litellm()
    stream = body.stream if isinstance(body, GeminiRequest) else False
    started = await upstream.start(upstream.arguments(to_chat(body, stream), headers))
    if started.iterator is None:
        reply = from_completion(_dump(started.response), upstream.name)
        return MessagesReply(upstream, started.secrets, started.meter, body=orjson.dumps(reply))
    return MessagesReply(upstream, started.secrets, started.meter, stream=started.response, events=_events(upstream, started))


# -- the request --------------------------------------------------------------------------------


def to_chat(body: Mapping[str, Any], stream: bool) -> dict[str, Any]:
    """The chat request for a Gemini request body."""
    messages: list[dict[str, Any]] = []
    system = _texts((body.get("systemInstruction") or body.get("system_instruction") or {}).get("parts"))
    if system:
        messages.append({"role": "system", "content": system})
    pending: list[str] = []  # ids of the last model content's calls, in order, for the responses after it
    for n, content in enumerate(body.get("contents") or ()):
        if not isinstance(content, dict):
            continue
        parts = [p for p in content.get("parts") or () if isinstance(p, dict)]
        if content.get("role") == "model":
            pending = []
            calls = []
            for k, part in enumerate(parts):
                call = part.get("functionCall")
                if isinstance(call, dict):
                    call_id = call.get("id") or f"call_{n}_{k}"
                    pending.append(call_id)
                    arguments = orjson.dumps(call.get("args") or {}).decode()
                    calls.append({"id": call_id, "type": "function", "function": {"name": call.get("name"), "arguments": arguments}})
            message: dict[str, Any] = {"role": "assistant", "content": _texts(parts) or None}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            continue
        answered: set[str] = set()
        for k, part in enumerate(p for p in parts if "functionResponse" in p):
            response = part["functionResponse"]
            given = response.get("id") if isinstance(response, dict) else None
            call_id = given if given in pending else (pending[k] if k < len(pending) else given or f"call_{n}_{k}")
            if call_id in answered:  # sent twice (Gemini CLI's --resume): once is the answer
                continue
            answered.add(call_id)
            output = (response.get("response") or {}) if isinstance(response, dict) else {}
            text = output["output"] if len(output) == 1 and isinstance(output.get("output"), str) else orjson.dumps(output).decode()
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        user = _user_content(parts)
        if user:
            messages.append({"role": "user", "content": user})
    chat: dict[str, Any] = {"model": body.model if isinstance(body, GeminiRequest) else "", "messages": messages, "stream": stream}
    tools = [_tool(d) for t in body.get("tools") or () if isinstance(t, dict)
             for d in t.get("functionDeclarations", t.get("function_declarations")) or () if isinstance(d, dict)]
    if tools:
        chat["tools"] = tools
        mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
        if mode in CALLING_MODES:
            chat["tool_choice"] = CALLING_MODES[mode]
    chat.update(_generation(body.get("generationConfig") or body.get("generation_config") or {}))
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _texts(parts: Any) -> str:
    return "".join(p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought"))


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user content's parts but its responses, as chat content: text, or text and images."""
    images = [p["inlineData"] for p in parts if isinstance(p.get("inlineData"), dict)]
    text = _texts(parts)
    if not images:
        return text
    out: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        url = f"data:{image.get('mimeType', 'application/octet-stream')};base64,{image.get('data', '')}"
        out.append({"type": "image_url", "image_url": {"url": url}})
    return out


def _tool(declaration: dict[str, Any]) -> dict[str, Any]:
    schema = declaration.get("parametersJsonSchema", declaration.get("parameters_json_schema"))
    if schema is None:
        schema = _lower_types(declaration.get("parameters") or {"type": "object", "properties": {}})
    function = {"name": declaration.get("name"), "parameters": schema}
    if declaration.get("description"):
        function["description"] = declaration["description"]
    return {"type": "function", "function": function}


def _lower_types(schema: Any) -> Any:
    """Gemini's OpenAPI schema (`"type": "OBJECT"`) as JSON Schema (`"object"`)."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _generation(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for gemini, chat in (("temperature", "temperature"), ("topP", "top_p"), ("maxOutputTokens", "max_tokens"),
                         ("stopSequences", "stop"), ("presencePenalty", "presence_penalty"),
                         ("frequencyPenalty", "frequency_penalty"), ("seed", "seed")):
        if config.get(gemini) is not None:
            out[chat] = config[gemini]
    if config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema")
        out["response_format"] = (
            {"type": "json_schema", "json_schema": {"name": "response", "schema": _lower_types(schema)}}
            if isinstance(schema, dict) else {"type": "json_object"}
        )
    return out


# -- the reply ----------------------------------------------------------------------------------


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


def _call_part(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    try:
        args = orjson.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = {"arguments": arguments}  # not JSON: kept whole rather than lost
    call: dict[str, Any] = {"name": name, "args": args if isinstance(args, dict) else {"value": args}}
    if call_id:
        call["id"] = call_id
    return {"functionCall": call}


def from_completion(data: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat completion as a GenerateContentResponse."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = [{"text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(_call_part(call.get("id"), str(function.get("name") or ""), str(function.get("arguments") or "")))
    candidate = {"content": {"role": "model", "parts": parts or [{"text": ""}]}, "index": 0,
                 "finishReason": FINISH_REASONS.get(choice.get("finish_reason") or "stop", "OTHER")}
    return {"candidates": [candidate], "usageMetadata": _usage(data.get("usage")), "modelVersion": model, "responseId": data.get("id")}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"


async def _events(upstream: LiteLLMUpstream, started: Any) -> AsyncIterator[bytes]:
    """The litellm stream as Gemini SSE chunks: text as it comes, the calls whole in the final
    chunk with its finishReason and the usage (which a chat stream sends after its finish)."""

    async def chunks() -> AsyncIterator[Any]:
        if started.first is not None:
            yield started.first
        async for chunk in started.iterator:
            yield chunk

    head = {"modelVersion": upstream.name}
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    usage: Any = None
    try:
        async for chunk in chunks():
            data = _dump(chunk)
            head.setdefault("responseId", data.get("id"))
            usage = data.get("usage") or usage
            for choice in data.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    parts = [{"text": delta["content"]}]
                    yield _sse({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], **head})
                for call in delta.get("tool_calls") or ():
                    held = calls.setdefault(int(call.get("index") or 0), {"id": "", "name": "", "arguments": ""})
                    function = call.get("function") or {}
                    held["id"] = call.get("id") or held["id"]
                    held["name"] += function.get("name") or ""
                    held["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    except Exception as exc:  # noqa: BLE001  # every provider failure becomes our error
        raise upstream.error(exc, started.secrets, midstream=True) from None
    if finish is None:
        log.warning("provider stream cut short", extra={"model": upstream.name, "litellm_model": upstream.litellm_model})
        raise ProviderStreamBroken(
            502, f"Model {upstream.describe}: provider {upstream.provider} ended the stream before the reply was done",
            "upstream_stream_broken",
        )
    parts = [_call_part(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())] or [{"text": ""}]
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": FINISH_REASONS.get(finish, "OTHER"), "index": 0}
    yield _sse({"candidates": [candidate], "usageMetadata": _usage(_dump(usage) if usage is not None else None), **head})
