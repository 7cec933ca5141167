"""A Responses request as a chat completion for litellm, and what its reply needs to come back.

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

`Translation` keeps what the way back needs (the tools' names, the settings a `response` echoes)
and makes the output items and the `response` object the reply and event modules send.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from .litellm import LiteLLMUpstream

NAMESPACE_SEPARATOR = "__"
SEAL_PREFIX = "cp-litellm-v1:"  # our encrypted_content: base64url(JSON {model, blocks, text})
ENCRYPTED_REASONING = "reasoning.encrypted_content"
CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, as free-form text."}},
    "required": ["input"],
}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


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
