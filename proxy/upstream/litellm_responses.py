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

The translation, in short:
- `instructions` and system/developer messages become system/developer messages; user and
  assistant text, images and files become chat content; an assistant's message and the calls
  after it become one assistant message with `tool_calls`; outputs become `tool` messages.
- Function tools go as they are; a namespace's tools go flattened (`<namespace>__<name>`) and
  come back with their `namespace`; a custom (free-form) tool goes as a function taking one
  string, `input`. Hosted tools (web search, file search, ...) have no chat form: they stay here.
- Reasoning: a provider's own reasoning (Anthropic's signed thinking, a reasoning model's text)
  comes back as a `reasoning` item whose `encrypted_content` seals it for this litellm model
  (when the request `include`s `reasoning.encrypted_content`, as the real API does), and goes
  back to that model as the assistant's `thinking_blocks` / `reasoning_content`. Any other
  reasoning item (another model's, or one without its sealed content) is of no use to this one
  and is left out.
- Server-side state: an unresolved `previous_response_id`, `conversation`, `prompt` and
  `background` need a provider that keeps responses; a `models:` entry keeps none, so they are
  a 400 (the proxy resolves the ids it stored and never sends them on).
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import InvalidRequest

log = logging.getLogger("proxy.litellm")

if TYPE_CHECKING:
    from .litellm import LiteLLMReply, LiteLLMUpstream

NAMESPACE_SEPARATOR = "__"
SEAL_PREFIX = "cp-litellm-v1:"  # our encrypted_content: base64url(JSON {model, blocks, text})
ENCRYPTED_REASONING = "reasoning.encrypted_content"
CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, as free-form text."}},
    "required": ["input"],
}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
# Parameters that need responses kept by the provider: a models: entry has none to offer.
SERVER_STATE = ("previous_response_id", "conversation", "prompt")
JSON_HEADERS = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


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


# -- the request --------------------------------------------------------------------------------


@dataclass(slots=True)
class Translation:
    """What one request's translation needs on the way back: the names its tools had, and the
    request's own settings a `response` object echoes."""

    public_model: str
    litellm_model: str
    include_encrypted: bool
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat name -> (namespace, name)
    custom: set[str] = field(default_factory=set)  # free-form tools, by name
    echo: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, body: Mapping[str, Any], upstream: LiteLLMUpstream) -> Translation:
        include = body.get("include")
        translation = cls(
            public_model=upstream.name,
            litellm_model=upstream.litellm_model,
            include_encrypted=isinstance(include, list) and ENCRYPTED_REASONING in include,
        )
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        translation.echo = {
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True),
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": body.get("truncation") or "disabled",
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }
        return translation

    def chat_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat completion request for `body` (LiteLLMUpstream.arguments picks what litellm gets)."""
        out: dict[str, Any] = {"model": self.public_model, "messages": self.messages(body)}
        tools = self.tools(body.get("tools"))
        if tools:
            out["tools"] = tools
            choice = self.tool_choice(body.get("tool_choice"), {t["function"]["name"] for t in tools})
            if choice is not None:
                out["tool_choice"] = choice
            if isinstance(body.get("parallel_tool_calls"), bool):
                out["parallel_tool_calls"] = body["parallel_tool_calls"]
        for name in ("temperature", "top_p", "user", "service_tier", "top_logprobs"):
            if body.get(name) is not None:
                out[name] = body[name]
        if isinstance(body.get("max_output_tokens"), int):
            out["max_tokens"] = body["max_output_tokens"]
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
            out["reasoning_effort"] = reasoning["effort"]
        text = body.get("text")
        if isinstance(text, dict):
            response_format = _response_format(text.get("format"))
            if response_format is not None:
                out["response_format"] = response_format
            if isinstance(text.get("verbosity"), str):
                out["verbosity"] = text["verbosity"]
        if body.get("stream") is True:
            out["stream"] = True
            out["stream_options"] = {"include_usage": True}  # the usage response.completed reports
        return out

    # tools

    def tools(self, tools: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for tool in tools if isinstance(tools, list) else ():
            if not isinstance(tool, dict):
                continue
            kind = tool.get("type")
            if kind == "function" and isinstance(tool.get("name"), str):
                out.append(_chat_function(tool["name"], tool))
            elif kind == "custom" and isinstance(tool.get("name"), str):
                self.custom.add(tool["name"])
                out.append(_chat_function(tool["name"], {**tool, "parameters": CUSTOM_INPUT_SCHEMA}))
            elif kind == "namespace" and isinstance(tool.get("name"), str):
                for inner in tool.get("tools") or ():
                    if (
                        isinstance(inner, dict)
                        and inner.get("type") == "function"
                        and isinstance(inner.get("name"), str)
                    ):
                        flat = tool["name"] + NAMESPACE_SEPARATOR + inner["name"]
                        self.namespaced[flat] = (tool["name"], inner["name"])
                        described = "\n\n".join(d for d in (tool.get("description"), inner.get("description")) if d)
                        out.append(_chat_function(flat, {**inner, "description": described or None}))
            # Hosted tools (web_search, file_search, mcp, ...) run at OpenAI only: no chat form.
        return out

    def tool_choice(self, choice: Any, names: set[str]) -> Any:
        if choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            name = choice.get("name")
            if isinstance(name, str) and name in names:
                return {"type": "function", "function": {"name": name}}
        return None  # a hosted tool, allowed_tools, ...: the provider's default (auto)

    def call_name(self, raw: Mapping[str, Any]) -> str:
        """The chat function name of a function_call item (its namespace folded in)."""
        name = str(raw.get("name") or "")
        namespace = raw.get("namespace")
        return namespace + NAMESPACE_SEPARATOR + name if isinstance(namespace, str) and namespace else name

    # messages

    def messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
        out: list[dict[str, Any]] = []
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            out.append({"role": "system", "content": body["instructions"]})
        turn: dict[str, Any] | None = None  # the assistant message being assembled
        thinking: dict[str, Any] | None = None  # sealed reasoning, for the assistant message that follows

        def close_turn() -> None:
            nonlocal turn
            if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                out.append(turn)
            turn = None

        def open_turn() -> dict[str, Any]:
            nonlocal turn, thinking
            if turn is None:
                turn = {"role": "assistant", "content": None}
                if thinking is not None:
                    turn.update(thinking)
                    thinking = None
            return turn

        for raw in items:
            if not isinstance(raw, dict):
                continue
            kind = raw.get("type") or ("message" if "role" in raw else "")
            if kind == "reasoning":
                close_turn()
                thinking = self.unseal(raw.get("encrypted_content"))
            elif kind == "message" and raw.get("role") == "assistant":
                if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                    close_turn()  # a second message: a message of its own
                text = _text(raw.get("content"))
                open_turn()["content"] = text or None
            elif kind == "message":
                close_turn()
                thinking = None
                message = _chat_message(raw)
                if message is not None:
                    out.append(message)
            elif kind in ("function_call", "custom_tool_call"):
                arguments = (
                    raw.get("arguments")
                    if kind == "function_call"
                    else orjson.dumps({"input": raw.get("input") or ""}).decode()
                )
                call = {
                    "id": str(raw.get("call_id")),
                    "type": "function",
                    "function": {
                        "name": self.call_name(raw),
                        "arguments": arguments if isinstance(arguments, str) else "",
                    },
                }
                open_turn().setdefault("tool_calls", []).append(call)
            elif kind in ("function_call_output", "custom_tool_call_output"):
                close_turn()
                out.append(
                    {"role": "tool", "tool_call_id": str(raw.get("call_id")), "content": _text(raw.get("output"))}
                )
            # Anything else (hosted tool calls, item references, compaction items) has no chat form.
        close_turn()
        return out

    # reasoning

    def seal(self, blocks: list[dict[str, Any]], text: str | None) -> str:
        payload = orjson.dumps({"model": self.litellm_model, "blocks": blocks, "text": text})
        return SEAL_PREFIX + base64.urlsafe_b64encode(payload).decode()

    def unseal(self, sealed: Any) -> dict[str, Any] | None:
        """The assistant fields that replay reasoning sealed for this model; None for any other."""
        if not isinstance(sealed, str) or not sealed.startswith(SEAL_PREFIX):
            return None
        try:
            data = orjson.loads(base64.urlsafe_b64decode(sealed[len(SEAL_PREFIX) :].encode()))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(data, dict) or data.get("model") != self.litellm_model:
            return None
        out: dict[str, Any] = {}
        blocks = [b for b in data.get("blocks") or () if isinstance(b, dict)]
        if blocks:
            out["thinking_blocks"] = blocks
        if isinstance(data.get("text"), str) and data["text"]:
            out["reasoning_content"] = data["text"]
        return out or None

    # the reply's items

    def reasoning_item(self, text: str, blocks: list[dict[str, Any]], item_id: str | None = None) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": item_id or new_id("rs"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if text else [],
        }
        if self.include_encrypted:
            item["encrypted_content"] = self.seal(blocks, text or None)
        return item

    def call_item(self, call_id: str, name: str, arguments: str, item_id: str | None = None) -> dict[str, Any]:
        if name in self.custom:
            try:
                value = orjson.loads(arguments).get("input") if arguments else ""
            except (ValueError, AttributeError):
                value = arguments
            return {
                "id": item_id or new_id("ctc"),
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": call_id,
                "name": name,
                "input": value if isinstance(value, str) else arguments,
            }
        item: dict[str, Any] = {
            "id": item_id or new_id("fc"),
            "type": "function_call",
            "status": "completed",
            "arguments": arguments,
            "call_id": call_id,
            "name": name,
        }
        if name in self.namespaced:
            item["namespace"], item["name"] = self.namespaced[name]
        return item

    def response(
        self,
        response_id: str,
        created_at: int,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        incomplete = None
        if status == "incomplete":
            incomplete = {"reason": "content_filter" if finish_reason == "content_filter" else "max_output_tokens"}
        return {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.public_model,
            "output": output,
            "previous_response_id": None,
            "usage": usage,
            **self.echo,
        }


def _chat_function(name: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = (
        tool.get("parameters") if isinstance(tool.get("parameters"), dict) else {"type": "object", "properties": {}}
    )
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return None


def _text(content: Any) -> str:
    """The text of a content value: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text") or p.get("refusal") or ""
            for p in content
            if isinstance(p, dict) and (p.get("type") in TEXT_PARTS or p.get("type") == "refusal")
        )
    return ""


def _chat_message(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """A system, developer or user message in chat form (images and files kept for the user)."""
    role = raw.get("role")
    content = raw.get("content")
    if role not in ("system", "developer", "user"):
        return None
    if isinstance(content, str) or role != "user":
        return {"role": role, "content": _text(content)}
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"url": part["image_url"]}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            file = {k: part[k] for k in ("file_data", "file_id", "filename") if isinstance(part.get(k), str)}
            if file:
                parts.append({"type": "file", "file": file})
    return {"role": role, "content": parts or ""}


# -- the reply ----------------------------------------------------------------------------------


def response_from_completion(completion: Mapping[str, Any], translation: Translation) -> dict[str, Any]:
    """A chat completion (JSON) as a `response` object."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") if isinstance(message.get("reasoning_content"), str) else ""
    blocks = [_block(b) for b in message.get("thinking_blocks") or () if isinstance(b, dict)]
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


def _block(block: Mapping[str, Any]) -> dict[str, Any]:
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


def sse_event(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


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


@dataclass(slots=True)
class _OpenItem:
    kind: str  # "reasoning", "message" or "call"
    index: int  # its output_index
    item_id: str
    text: list[str] = field(default_factory=list)  # reasoning / message text, call arguments
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)  # thinking blocks by their index
    call_index: int | None = None  # the chat tool call's index
    call_id: str = ""
    name: str = ""


class EventWriter:
    """Chat completion chunks in, Responses events out: one output item open at a time (a new
    kind of delta closes the item before it), numbered from 0, the final events at `finish`."""

    def __init__(self, translation: Translation) -> None:
        self._t = translation
        self._seq = 0
        self._id = new_id("resp")
        self._created = int(time.time())
        self._output: list[dict[str, Any]] = []  # finished items, in order
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # chat tool call index -> its item
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(event)

    def start(self) -> bytes:
        started = self._t.response(self._id, self._created, "in_progress", [], None)
        return self._event("response.created", response=started) + self._event("response.in_progress", response=started)

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        out: list[bytes] = []
        if isinstance(chunk.get("usage"), dict):
            self._usage = response_usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            reasoning = delta.get("reasoning_content")
            blocks = delta.get("thinking_blocks")
            if (isinstance(reasoning, str) and reasoning) or blocks:
                out.append(self._reasoning(reasoning if isinstance(reasoning, str) else "", blocks))
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(self._message_text(content))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.append(self._call(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                out.append(self._close())
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events: the open item's end, then response.completed (or .incomplete)."""
        out = self._close()
        status = "incomplete" if self._finish in ("length", "content_filter") else "completed"
        response = self._t.response(self._id, self._created, status, list(self._output), self._usage, self._finish)
        return out + self._event(f"response.{status}", response=response)

    # items

    def _switch(self, kind: str) -> tuple[bytes, _OpenItem | None]:
        """Close the open item unless it is of `kind` (calls: never reopened)."""
        if self._open is not None and self._open.kind == kind and kind != "call":
            return b"", self._open
        return self._close(), None

    def _reasoning(self, text: str, blocks: Any) -> bytes:
        out, item = self._switch("reasoning")
        if item is None:
            item = self._open = _OpenItem("reasoning", len(self._output), new_id("rs"))
            out += self._event(
                "response.output_item.added",
                output_index=item.index,
                item={"id": item.item_id, "type": "reasoning", "summary": []},
            )
            out += self._event(
                "response.reasoning_summary_part.added",
                item_id=item.item_id,
                output_index=item.index,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        for block in blocks if isinstance(blocks, list) else ():
            if isinstance(block, dict):
                _merge_block(item.blocks, block)
        if text:
            item.text.append(text)
            out += self._event(
                "response.reasoning_summary_text.delta",
                item_id=item.item_id,
                output_index=item.index,
                summary_index=0,
                delta=text,
            )
        return out

    def _message_text(self, text: str) -> bytes:
        out, item = self._switch("message")
        if item is None:
            item = self._open = _OpenItem("message", len(self._output), new_id("msg"))
            out += self._event(
                "response.output_item.added",
                output_index=item.index,
                item={
                    "id": item.item_id,
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                },
            )
            out += self._event(
                "response.content_part.added",
                item_id=item.item_id,
                output_index=item.index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        item.text.append(text)
        return out + self._event(
            "response.output_text.delta",
            item_id=item.item_id,
            output_index=item.index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _call(self, call: Mapping[str, Any]) -> bytes:
        index = call.get("index") if isinstance(call.get("index"), int) else len(self._calls)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments") if isinstance(function.get("arguments"), str) else ""
        out = b""
        item = self._calls.get(index)
        if item is None:
            out, _ = self._switch("call")
            name = str(function.get("name") or "")
            item = self._open = self._calls[index] = _OpenItem(
                "call",
                len(self._output),
                "",
                call_index=index,
                call_id=str(call.get("id") or new_id("call")),
                name=name,
            )
            shown = self._t.call_item(item.call_id, name, "")
            item.item_id = shown["id"]
            shown["status"] = "in_progress"
            out += self._event("response.output_item.added", output_index=item.index, item=shown)
        elif item is not self._open:
            # Providers stream one call after the other; one that goes back to a call already
            # closed (and shown whole) can't be followed: say so rather than guess.
            log.warning("a streamed tool call went on after the next one began", extra={"model": self._t.public_model})
            return b""
        if arguments:
            item.text.append(arguments)
            if item.name not in self._t.custom:  # a free-form input is shown whole, when done
                out += self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.item_id,
                    output_index=item.index,
                    delta=arguments,
                )
        return out

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        text = "".join(item.text)
        at = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "reasoning":
            done = self._t.reasoning_item(text, [_block(b) for _, b in sorted(item.blocks.items())], item.item_id)
            out = self._event("response.reasoning_summary_text.done", **at, summary_index=0, text=text)
            out += self._event(
                "response.reasoning_summary_part.done",
                **at,
                summary_index=0,
                part={"type": "summary_text", "text": text},
            )
        elif item.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            done = {
                "id": item.item_id,
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
            out = self._event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", **at, content_index=0, part=part)
        else:
            done = self._t.call_item(item.call_id, item.name, text, item.item_id)
            out = b""
            if done["type"] == "function_call":
                out = self._event("response.function_call_arguments.done", **at, arguments=text)
        self._output.append(done)
        return out + self._event("response.output_item.done", output_index=item.index, item=done)


def _merge_block(blocks: dict[int, dict[str, Any]], delta: Mapping[str, Any]) -> None:
    """Add a streamed thinking block delta to the block of its index: text appended, the
    signature (or a redacted block's data) kept."""
    index = delta.get("index") if isinstance(delta.get("index"), int) else len(blocks)
    block = blocks.setdefault(index, {"type": delta.get("type") or "thinking"})
    if block["type"] == "thinking":
        block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
    for key in ("signature", "data"):
        if delta.get(key):
            block[key] = delta[key]
